#include "sana/util/torch_build.h"

#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/version.h>

namespace sana::util {

std::string torch_build_summary() {
  // device_count() is 0, not an error, where no driver or no GPU is present.
  const int devices = static_cast<int>(c10::cuda::device_count());
  return fmt::format("LibTorch {}, CUDA {}.{} compiled in, {}", TORCH_VERSION, CUDART_VERSION / 1000,
                     CUDART_VERSION % 1000 / 10,
                     devices == 0 ? std::string("no device")
                                  : fmt::format("{} CUDA device{}", devices, devices == 1 ? "" : "s"));
}

}  // namespace sana::util
