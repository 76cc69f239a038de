// A CUDA device's name and memory as the driver reports them.
#include <ATen/cuda/CUDAContext.h>

#include "sana/train/report/device_peak.h"

namespace sana::train {

std::string cuda_device_name(int index) { return at::cuda::getDeviceProperties(index)->name; }

int64_t cuda_device_memory(int index) {
  return static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
}

}  // namespace sana::train
