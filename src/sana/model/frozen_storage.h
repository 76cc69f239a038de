// A frozen base kept in less memory (train.frozen_base_dtype, docs/finetune.md): the weights
// of the Linear and Conv2d layers that do not train, stored in bf16, fp16 or int8 and turned
// back into the compute dtype one layer at a time, in the forward and again in the backward.
//  - bf16 / fp16: the weight cast (diffusers' LoRA scripts cast the frozen transformer to the
//    training dtype).
//  - int8: weight-only, per output channel, symmetric: scale_o = max_i |w_oi| / 127 (1 for
//    an all-zero row), q_oi = round(w_oi / scale_o) in [-127, 127]; the layer computes with
//    q * scale. The scales are a parameter of the layer, "weight_scale" (fp32, one per
//    output channel), so the base's checksum covers them.
//  - The layer computes in its input's dtype (under CUDA autocast, autocast's): the product
//    is a custom autograd function that saves the stored weight, not the converted one, so
//    a backward keeps no full-precision copy of the base; it gives the input its gradient
//    and the frozen weight none. Biases and the other frozen parameters (norms, modulation
//    tables, embeddings: a few per mille of a model) stay as they are.
// The layers are replaced from outside (model/sana_ms.h's LayerHost): LoRA wraps the stored
// layer as it wraps any other.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "sana/model/sana_ms.h"
#include "sana/model/storage_dtype.h"

namespace sana::model {

struct StorageReport {
  int64_t layers = 0;        // layers stored in the dtype
  int64_t bytes_before = 0;  // their weights' bytes before
  int64_t bytes_after = 0;   // and after (int8: the scales included)
  int64_t largest = 0;       // elements of the largest such weight (its converted copy is transient)
};

// Stores the weight of every Linear and Conv2d layer of `model` whose path `frozen` accepts
// in `dtype` (fp32: nothing changes). Runs on any device, meta included (shapes only). The
// layers' parameters must not require gradients.
StorageReport store_frozen_layers(SanaMSImpl& model, StorageDtype dtype,
                                  const std::function<bool(const std::string& layer)>& frozen);

// The dtype `model`'s stored layers are in (fp32 when none is).
StorageDtype frozen_storage_dtype(const SanaMSImpl& model);

// Every parameter and buffer of `model` (registration order) as the model holds them without
// stored layers: each stored weight back in the dtype its layer computes in (a cast, or the
// int8 codes times their scales), the int8 scales left out. What a file of the whole model
// holds (a ControlNet's final model.safetensors).
std::vector<std::pair<std::string, torch::Tensor>> restored_tensors(const SanaMSImpl& model);

// The weight of a stored int8 layer in `dtype`: q * scale, per output channel.
torch::Tensor dequantize_int8(const torch::Tensor& q, const torch::Tensor& scale, torch::ScalarType dtype);
// int8 codes and fp32 scales of `weight`, as int8 storage keeps them.
std::pair<torch::Tensor, torch::Tensor> quantize_int8(const torch::Tensor& weight);

}  // namespace sana::model
