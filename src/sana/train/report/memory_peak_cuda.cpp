// The CUDA caching allocator's statistics (built with a CUDA LibTorch only).
#include <c10/cuda/CUDACachingAllocator.h>

#include "sana/train/report/memory_use.h"

namespace sana::train {

namespace {

// Index 0 of the stat arrays is StatType::AGGREGATE (all pools), in LibTorch 1.13 and 2.x,
// whose namespaces for the enum differ.
constexpr size_t kAggregate = 0;

}  // namespace

void reset_cuda_peak(int index) { c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index)); }

int64_t cuda_peak_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[kAggregate].peak;
}

int64_t cuda_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[kAggregate].current;
}

}  // namespace sana::train
