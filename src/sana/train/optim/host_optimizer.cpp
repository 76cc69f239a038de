#include "sana/train/optim/host_optimizer.h"

#include <fmt/format.h>

#include <stdexcept>

namespace sana::train {

namespace {

// A flat fp32 tensor of `numel` elements in host memory: page-locked when the device is a
// GPU (so the copies to and from it run at full speed and the uploads need not wait).
torch::Tensor host_flat(int64_t numel, const torch::Device& device) {
  auto options = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
  if (device.is_cuda()) options = options.pinned_memory(true);
  return torch::zeros({numel}, options);
}

}  // namespace

HostOptimizer::HostOptimizer(const OptimizerOptions& options, const NamedParams& params,
                             std::vector<parallel::FlatBucket> buckets, bool gradients_on_host)
    : device_(std::move(buckets)), copy_gradients_(!gradients_on_host), masters_(params.size()) {
  torch::NoGradGuard no_grad;
  std::vector<bool> covered(params.size(), false);
  for (const auto& b : device_) {
    if (!copy_gradients_ && (!b.grads.defined() || !b.grads.is_cpu())) {
      throw std::logic_error("train.offload_optimizer: the reducer's gradients are not in host memory");
    }
    // Page-locked where copies cross to a device: the masters' to the bucket's parameters
    // (in host memory already for a swapped block's), the gradients' from the device.
    parallel::FlatBucket h{host_flat(b.params.numel(), b.params.device()),
                           copy_gradients_ ? host_flat(b.params.numel(), b.grads.device()) : b.grads, b.layout};
    h.layout.dtype = static_cast<int>(torch::kFloat32);
    h.params.copy_(b.params);
    for (size_t j = 0; j < b.layout.params.size(); ++j) {
      const size_t k = b.layout.params[j];
      const auto& [name, p] = params.at(k);
      // A leaf tensor of the parameter's shape over the master bucket, its .grad over the
      // gradient buffer: what the inner optimizer reads and updates per parameter.
      auto master = torch::empty({0}, h.params.options());
      master.set_data(h.params.narrow(0, b.layout.offsets[j], p.numel()).view(p.sizes()));
      master.mutable_grad() = h.grads.narrow(0, b.layout.offsets[j], p.numel()).view(p.sizes());
      masters_[k] = {name, master};
      covered[k] = true;
    }
    host_.push_back(std::move(h));
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (!covered[k]) {
      throw std::logic_error(fmt::format("train.offload_optimizer: parameter '{}' is in no flat bucket", params[k].first));
    }
  }
  inner_ = make_optimizer(options, masters_);
  inner_->use_flat_buckets(host_);
}

void HostOptimizer::apply(double lr) {
  torch::NoGradGuard no_grad;
  // Blocking: the host reads the gradients right after (and the copy waits for the backward
  // and the reduction queued before it on the device).
  if (copy_gradients_) {
    for (size_t b = 0; b < device_.size(); ++b) host_[b].grads.copy_(device_[b].grads);
  }
  inner_->step(lr);
  // From page-locked memory on a GPU these run asynchronously, in order with the next
  // forward on the same stream; the next step's gradient copy waits for them.
  for (size_t b = 0; b < device_.size(); ++b) device_[b].params.copy_(host_[b].params, /*non_blocking=*/true);
}

void HostOptimizer::weights_changed() {
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < device_.size(); ++b) host_[b].params.copy_(device_[b].params);
}

std::vector<torch::Tensor> HostOptimizer::host_weights() const {
  std::vector<torch::Tensor> out;
  for (const auto& h : host_) out.push_back(h.params);
  return out;
}

std::vector<torch::Tensor> HostOptimizer::host_gradients() const {
  std::vector<torch::Tensor> out;
  for (const auto& h : host_) out.push_back(h.grads);
  return out;
}

}  // namespace sana::train
