// A CUDA device's name as the driver reports it.
#include <ATen/cuda/CUDAContext.h>

#include "sana/train/report/device_peak.h"

namespace sana::train {

std::string cuda_device_name(int index) { return at::cuda::getDeviceProperties(index)->name; }

}  // namespace sana::train
