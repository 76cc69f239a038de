// Calls back after each parameter's gradient has been accumulated (the reducer launches
// bucket reductions from it; ZeRO stage 3 releases gathered blocks). The hook is the
// tensor's own post-accumulate hook, not one on its autograd accumulator: set_data() to
// another device (block swapping, model/swapped_blocks.h, moves a trained block between
// host and device) makes autograd forget the accumulator and build a new one, and a hook
// on the old one would never run again. Several owners may hook one parameter; each is
// called in the order it came. Like any tensor hook, it runs only for a defined gradient (a
// checkpointed block gives its unused trained parameters zeros, model/block_checkpoint.cpp). The hooks stay as long as the parameters live; once this
// object goes they reach nothing, so a later backward is safe.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace sana::parallel {

class AccumulatorHooks {
 public:
  // `on_gradient(k)` after params[k]'s accumulator runs (on autograd's thread).
  AccumulatorHooks(const std::vector<torch::Tensor>& params, std::function<void(size_t)> on_gradient);
  ~AccumulatorHooks();
  AccumulatorHooks(const AccumulatorHooks&) = delete;
  AccumulatorHooks& operator=(const AccumulatorHooks&) = delete;

  struct Target {
    std::mutex mutex;
    std::function<void(size_t)> call;  // empty once the owner is gone
  };

 private:
  std::shared_ptr<Target> target_;
  // Each parameter's accumulator as it was when hooked, kept alive: ZeRO 3 points a gathered
  // half-precision parameter back at it, so gradients arrive there in fp32
  // (gathered_parameters.cpp). A move to another device still makes autograd build a new
  // one, which the tensor's hooks follow.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
};

}  // namespace sana::parallel
