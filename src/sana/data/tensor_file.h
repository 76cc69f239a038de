// Precomputed features on disk: NumPy .npy/.npz and safetensors files (plain files or tar
// shard members, file_ref.h), read into float32 tensors: latents from a VAE, caption
// features from a text encoder, computed elsewhere. A bad file is a TensorFileError saying
// what is wrong, never a crash.
#pragma once

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "sana/util/error.h"

namespace sana::data {

class TensorFileError : public sana::RunError {
 public:
  explicit TensorFileError(const std::string& what) : RunError(what, "tensor file error") {}
};

// .npy (little-endian floats, C order), .npz (the array `key`, else "z", else its only
// array) or .safetensors (F16/BF16/F32/F64; the tensor `key`, else its only tensor).
// Returns float32.
torch::Tensor read_tensor_file(const std::string& path, const std::string& key = "");

// Caption features as upstream Sana stores them: an .npz (or .safetensors) with
// `caption_feature` (1, T, C) and optionally `attention_mask` (1, T), or a lone array.
struct TextFeatures {
  torch::Tensor features;  // [T, C] float32
  torch::Tensor mask;      // [T] float32 1/0; undefined when the file has none
};
TextFeatures read_text_features(const std::string& path);

}  // namespace sana::data
