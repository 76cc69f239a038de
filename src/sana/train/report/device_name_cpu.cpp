// A LibTorch without CUDA has no CUDA device to name (device_name_cuda.cpp has the other).
#include "sana/train/report/device_peak.h"

namespace sana::train {

std::string cuda_device_name(int) { return ""; }

}  // namespace sana::train
