#include "sana/parallel/accumulator_hooks.h"

#include <algorithm>
#include <utility>

namespace sana::parallel {

namespace {

// A tensor has one post-accumulate hook slot: this one calls every owner that hooked it
// (and a hook that was there before, first).
struct AccumulatedHooks : public torch::autograd::PostAccumulateGradHook {
  void operator()(const torch::autograd::Variable& tensor) override {
    if (before) (*before)(tensor);
    for (const auto& [target, index] : calls) {
      std::lock_guard<std::mutex> lock(target->mutex);
      if (target->call) target->call(index);
    }
  }
  std::unique_ptr<torch::autograd::PostAccumulateGradHook> before;
  std::vector<std::pair<std::shared_ptr<AccumulatorHooks::Target>, size_t>> calls;
};

void add_call(const torch::Tensor& param, const std::shared_ptr<AccumulatorHooks::Target>& target, size_t index) {
  auto& slot = torch::autograd::impl::post_acc_grad_hooks(param);
  auto* ours = dynamic_cast<AccumulatedHooks*>(slot.get());
  if (ours == nullptr) {
    auto fresh = std::make_unique<AccumulatedHooks>();
    fresh->before = std::move(slot);
    ours = fresh.get();
    torch::autograd::impl::set_post_acc_grad_hooks(param, std::move(fresh));
  }
  // Owners gone (an elastic regroup builds the reducer anew) need no call.
  auto& calls = ours->calls;
  calls.erase(std::remove_if(calls.begin(), calls.end(),
                             [](const auto& c) {
                               std::lock_guard<std::mutex> lock(c.first->mutex);
                               return !c.first->call;
                             }),
              calls.end());
  calls.emplace_back(target, index);
}

}  // namespace

AccumulatorHooks::AccumulatorHooks(const std::vector<torch::Tensor>& params, std::function<void(size_t)> on_gradient)
    : target_(std::make_shared<Target>()) {
  target_->call = std::move(on_gradient);
  for (size_t k = 0; k < params.size(); ++k) {
    add_call(params[k], target_, k);
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params[k]));
  }
}

AccumulatorHooks::~AccumulatorHooks() {
  std::lock_guard<std::mutex> lock(target_->mutex);
  target_->call = nullptr;  // a backward after this one reaches no dangling object
}

}  // namespace sana::parallel
