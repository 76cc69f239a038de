// HostCopies (model/host_copies.h): a side stream and an event per batch on a GPU.
#include "sana/model/host_copies.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <optional>

namespace sana::model {

struct HostCopies::Impl {
  torch::Device device{torch::kCPU};
  std::optional<c10::cuda::CUDAStream> side;  // GPU devices only
  std::map<int64_t, at::cuda::CUDAEvent> copied;
  int64_t next = 0;
};

HostCopies::HostCopies(const torch::Device& device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  if (device.is_cuda()) impl_->side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
}

HostCopies::~HostCopies() = default;

torch::Tensor HostCopies::host_copy(const torch::Tensor& t, bool page_locked) const {
  auto host = t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  return impl_->side && page_locked ? host.pin_memory() : host;
}

std::vector<torch::Tensor> HostCopies::start(const std::vector<torch::Tensor>& host, int64_t& ticket) {
  ticket = impl_->next++;
  std::vector<torch::Tensor> out;
  out.reserve(host.size());
  if (!impl_->side) {
    for (const auto& t : host) out.push_back(t.clone());
    return out;
  }
  const c10::cuda::CUDAGuard on_device(impl_->device.index());
  const c10::cuda::CUDAStreamGuard on_side(*impl_->side);
  // From page-locked memory each copy is asynchronous on the side stream.
  for (const auto& t : host) out.push_back(t.to(impl_->device, /*non_blocking=*/true));
  impl_->copied[ticket].record(*impl_->side);
  return out;
}

void HostCopies::wait(int64_t ticket, const std::vector<torch::Tensor>& copies) {
  const auto it = impl_->copied.find(ticket);
  if (it == impl_->copied.end()) return;  // on the CPU, or waited for already
  const c10::cuda::CUDAGuard on_device(impl_->device.index());
  const auto compute = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  it->second.block(compute);  // the GPU waits, not the host
  for (const auto& t : copies) t.record_stream(compute);  // allocated on the side stream, used on compute
  impl_->copied.erase(it);
}

}  // namespace sana::model
