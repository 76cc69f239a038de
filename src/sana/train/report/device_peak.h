// What the accelerator could do, for MFU (model FLOPs utilisation: the training FLOPs the
// model needs per second over the device's peak): the dense tensor-core peak of known
// NVIDIA parts by device name, and the name of a CUDA device. train.peak_tflops overrides
// the table. No torch.
#pragma once

#include <cstdint>
#include <string>

namespace sana::train {

// Dense (no sparsity) peak TFLOP/s of the GPU named `device_name` (as CUDA reports it,
// e.g. "NVIDIA H100 80GB HBM3") for bf16/fp16 (`half`) or TF32 matrix products; 0 for a
// name the table does not know.
double peak_tflops_for(const std::string& device_name, bool half);

// CUDA device `index`'s name, as the driver reports it (device_name_cuda.cpp).
std::string cuda_device_name(int index);
// Its memory in bytes, all of it (device_name_cuda.cpp).
int64_t cuda_device_memory(int index);

}  // namespace sana::train
