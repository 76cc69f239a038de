// Precomputed features on disk: NumPy .npy and safetensors files, read into float32
// tensors (latents from a VAE, caption features from a text encoder, computed elsewhere).
// A bad file is a TensorFileError saying what is wrong, never a crash.
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

// .npy (little-endian f2/f4/f8, C order) or .safetensors (F16/BF16/F32/F64; the tensor
// named `key`, else the only tensor in the file). Returns float32.
torch::Tensor read_tensor_file(const std::string& path, const std::string& key = "");

}  // namespace sana::data
