// Host-to-device copies of training batches. On a CUDA device the loader pins its batches
// (page-locked memory) and the copies run non-blocking on a side stream, so the copy of
// micro-batch n+1 runs while the compute stream is still busy with n (the loop issues it
// as soon as n's kernels are queued); the compute stream waits for a copy only where the
// batch is used, and the copied tensors are recorded on it so their memory is not reused
// early. On the CPU tensors pass through. CMake builds device_feed_cuda.cpp with a CUDA
// LibTorch and device_feed_cpu.cpp otherwise.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace sana::train {

class DeviceFeed {
 public:
  explicit DeviceFeed(torch::Device device);
  ~DeviceFeed();
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;

  // Whether host batches should be page-locked (the device is a GPU).
  bool pinned() const;
  // A host tensor made from values (e.g. labels), pinned when pinned().
  torch::Tensor host_tensor(torch::Tensor t) const;
  // The tensors on the device, in order (undefined ones stay undefined), ready for use on
  // the current stream.
  std::vector<torch::Tensor> to_device(const std::vector<torch::Tensor>& host);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Plain copies in order (undefined tensors stay undefined): the CPU, and CUDA builds running
// on the CPU.
inline std::vector<torch::Tensor> copy_each(const std::vector<torch::Tensor>& host, torch::Device device) {
  std::vector<torch::Tensor> out;
  out.reserve(host.size());
  for (const auto& t : host) out.push_back(t.defined() ? t.to(device) : t);
  return out;
}

}  // namespace sana::train
