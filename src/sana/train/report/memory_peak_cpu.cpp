// A LibTorch without CUDA has no CUDA allocator to read (memory_peak_cuda.cpp has the other).
#include "sana/train/report/memory_use.h"

namespace sana::train {

void reset_cuda_peak(int) {}
int64_t cuda_peak_bytes(int) { return -1; }
int64_t cuda_allocated_bytes(int) { return -1; }

}  // namespace sana::train
