// A frozen base kept in less memory (train.frozen_base_dtype, docs/finetune.md): the weights
// of the Linear and Conv2d layers that do not train, stored in one of model/stored_weight.h's
// formats (bf16, fp16, int8, fp8, NF4) and turned back into the compute dtype one layer at a
// time, in the forward and again in the backward.
//  - What turns the codes back is registered beside the weight as parameters of the layer
//    ("weight_scale", "weight_absmax", "weight_nested_absmax", "weight_offset"), so the
//    base's checksum covers it.
//  - The layer computes in its input's dtype (under CUDA autocast, autocast's): the product
//    is a custom autograd function that saves the stored weight, not the restored one, so
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
#include "sana/model/stored_weight.h"

namespace sana::model {

struct StorageReport {
  int64_t layers = 0;        // layers stored in the dtype
  int64_t bytes_before = 0;  // their weights' bytes before
  int64_t bytes_after = 0;   // and after (what turns the codes back included)
  int64_t largest = 0;       // elements of the largest such weight
  int64_t transient = 0;     // bytes restoring the largest one takes while its product runs
};

// Stores the weight of every Linear and Conv2d layer of `model` whose path `frozen` accepts
// in `dtype` (fp32: nothing changes). Runs on any device, meta included (shapes only). The
// layers' parameters must not require gradients.
StorageReport store_frozen_layers(SanaMSImpl& model, StorageDtype dtype,
                                  const std::function<bool(const std::string& layer)>& frozen);

// The dtype `model`'s stored layers are in (fp32 when none is).
StorageDtype frozen_storage_dtype(const SanaMSImpl& model);

// Every parameter and buffer of `model` (registration order) as the model holds them without
// stored layers: each stored weight back in the dtype its layer computes in (restore_weight),
// what turns the codes back left out. What a file of the whole model holds (a ControlNet's
// final model.safetensors).
std::vector<std::pair<std::string, torch::Tensor>> restored_tensors(const SanaMSImpl& model);

}  // namespace sana::model
