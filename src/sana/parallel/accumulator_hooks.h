// Calls back after each parameter's gradient has been accumulated: a post-hook on the
// parameter's autograd accumulator (the reducer launches bucket reductions from it; ZeRO
// stage 3 releases gathered blocks). The hooks stay on the accumulators as long as the
// parameters live; once this object goes they reach nothing, so a later backward is safe.
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
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
};

}  // namespace sana::parallel
