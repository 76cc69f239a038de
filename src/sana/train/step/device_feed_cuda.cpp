// DeviceFeed for CUDA LibTorch builds: pinned host batches, copied on a side stream.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "sana/train/step/device_feed.h"

namespace sana::train {

struct DeviceFeed::Impl {
  torch::Device device;
  std::optional<c10::cuda::CUDAStream> side;  // GPU devices only
};

DeviceFeed::DeviceFeed(torch::Device device) : impl_(std::make_unique<Impl>(Impl{device, std::nullopt})) {
  if (device.is_cuda()) impl_->side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
}

DeviceFeed::~DeviceFeed() = default;

bool DeviceFeed::pinned() const { return impl_->side.has_value(); }

torch::Tensor DeviceFeed::host_tensor(torch::Tensor t) const { return pinned() ? t.pin_memory() : t; }

std::vector<torch::Tensor> DeviceFeed::to_device(const std::vector<torch::Tensor>& host) {
  if (!impl_->side) return copy_each(host, impl_->device);
  std::vector<torch::Tensor> out;
  out.reserve(host.size());
  const c10::cuda::CUDAGuard on_device(impl_->device.index());
  const auto compute = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  at::cuda::CUDAEvent copied;
  {
    const c10::cuda::CUDAStreamGuard on_side(*impl_->side);
    // From pinned memory the copy is asynchronous; the pinned block stays reserved until
    // it is done (LibTorch's host allocator records the copy's stream).
    for (const auto& t : host) out.push_back(t.defined() ? t.to(impl_->device, /*non_blocking=*/true) : t);
    copied.record(*impl_->side);
  }
  copied.block(compute);  // the GPU waits, not the host
  for (auto& t : out) {
    if (t.defined()) t.record_stream(compute);  // memory allocated on the side stream, used on compute
  }
  return out;
}

}  // namespace sana::train
