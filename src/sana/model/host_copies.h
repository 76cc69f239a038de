// Copies to the device ahead of their use (model/swapped_blocks.h): on a GPU from
// page-locked memory on a side stream, each batch with an event the compute stream waits for
// only when it needs the copies; on the CPU plain copies, done at once.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace sana::model {

class HostCopies {
 public:
  explicit HostCopies(const torch::Device& device);
  ~HostCopies();
  HostCopies(const HostCopies&) = delete;
  HostCopies& operator=(const HostCopies&) = delete;

  // A host copy of `t` that start() copies from asynchronously: page-locked on a GPU, unless
  // `page_locked` is false (a copy that something page-locked replaces soon).
  torch::Tensor host_copy(const torch::Tensor& t, bool page_locked = true) const;
  // Starts copying `host` to the device: the copies, each under way until wait(ticket).
  std::vector<torch::Tensor> start(const std::vector<torch::Tensor>& host, int64_t& ticket);
  // The compute stream waits for ticket's copies (the host does not), which it then uses.
  void wait(int64_t ticket, const std::vector<torch::Tensor>& copies);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sana::model
