// A weight in less memory (train.frozen_base_dtype; the layers that compute with it:
// model/frozen_storage.h): its codes and what turns them back, per format.
//  - bf16 / fp16: the weight cast (diffusers' LoRA scripts cast the frozen transformer to the
//    training dtype).
//  - int8: weight-only, per output channel, symmetric: scale_o = max_i |w_oi| / 127 (1 for
//    an all-zero row), q_oi = round(w_oi / scale_o) in [-127, 127]; restored as q * scale.
//  - fp8: e4m3 (torch's float8_e4m3fn), per output channel: scale_o = max_i |w_oi| / 448 (1
//    for an all-zero row), q_oi = w_oi / scale_o cast to e4m3; restored as q * scale.
//  - nf4 / nf4-dq: bitsandbytes' NF4 (QLoRA's NormalFloat table), as its quantize_4bit
//    computes it: the weight flattened into blocks of 64, each scaled by its absmax to
//    [-1, 1] and rounded to the nearest of the 16 values, two codes a byte (the first in the
//    high nibble). nf4-dq (bnb_4bit_use_double_quant) keeps the absmax values as uint8 codes
//    of bitsandbytes' signed dynamic map, less their mean, in blocks of 256 with an fp32
//    absmax each. Restored as bitsandbytes' dequantize_4bit: table value x absmax in fp32,
//    then the compute dtype.
// Never a layer or a model: what stores a model's layers is frozen_storage.h.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "sana/model/storage_dtype.h"

namespace sana::model {

// A weight in its stored form: the codes (the layer's "weight" parameter) and what turns
// them back. Undefined tensors are what the dtype does not keep.
struct StoredWeight {
  StorageDtype dtype = StorageDtype::fp32;
  std::vector<int64_t> shape;  // the weight's own ([out, in] or [out, in / groups, k, k])
  // bf16 / fp16: the weight cast; int8 / fp8: [shape]; nf4: uint8 [ceil(elements / 2)].
  torch::Tensor codes;
  torch::Tensor scale;          // int8, fp8: fp32, one per output channel
  torch::Tensor absmax;         // nf4: fp32, one per block of 64 (the last may be shorter); nf4-dq: their uint8 codes
  torch::Tensor nested_absmax;  // nf4-dq: fp32, one per block of 256 absmax codes
  torch::Tensor offset;         // nf4-dq: the absmax values' mean, fp32, one element
};

// `weight` in `dtype`'s stored form (fp32: the weight as it is). Meta gives meta tensors of
// the stored shapes.
StoredWeight store_weight(const torch::Tensor& weight, StorageDtype dtype);
// The stored weight in `dtype`, of its own shape.
torch::Tensor restore_weight(const StoredWeight& w, torch::ScalarType dtype);

// The most bytes restore_weight takes at once for a weight of `elements`, computing in fp32.
int64_t restore_bytes(StorageDtype dtype, int64_t elements);

// int8 storage's codes and fp32 scales of `weight`, and its restore.
std::pair<torch::Tensor, torch::Tensor> quantize_int8(const torch::Tensor& weight);
torch::Tensor dequantize_int8(const torch::Tensor& q, const torch::Tensor& scale, torch::ScalarType dtype);

}  // namespace sana::model
