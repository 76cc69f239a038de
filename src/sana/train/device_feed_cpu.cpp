// DeviceFeed for LibTorch builds without CUDA: the device is the CPU, tensors pass through.
#include "sana/train/device_feed.h"

namespace sana::train {

struct DeviceFeed::Impl {
  torch::Device device;
};

DeviceFeed::DeviceFeed(torch::Device device) : impl_(std::make_unique<Impl>(Impl{device})) {}
DeviceFeed::~DeviceFeed() = default;

bool DeviceFeed::pinned() const { return false; }

torch::Tensor DeviceFeed::host_tensor(torch::Tensor t) const { return t; }

std::vector<torch::Tensor> DeviceFeed::to_device(const std::vector<torch::Tensor>& host) {
  return copy_each(host, impl_->device);
}

}  // namespace sana::train
