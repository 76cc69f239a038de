#include "sana/parallel/accumulator_hooks.h"

#include <utility>

namespace sana::parallel {

namespace {

struct AccumulatedHook : public torch::autograd::FunctionPostHook {
  AccumulatedHook(std::shared_ptr<AccumulatorHooks::Target> target, size_t index)
      : target_(std::move(target)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    std::lock_guard<std::mutex> lock(target_->mutex);
    if (target_->call) target_->call(index_);
    return outputs;
  }
  std::shared_ptr<AccumulatorHooks::Target> target_;
  size_t index_;
};

}  // namespace

AccumulatorHooks::AccumulatorHooks(const std::vector<torch::Tensor>& params, std::function<void(size_t)> on_gradient)
    : target_(std::make_shared<Target>()) {
  target_->call = std::move(on_gradient);
  for (size_t k = 0; k < params.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params[k]);
    acc->add_post_hook(std::make_unique<AccumulatedHook>(target_, k));
    accumulators_.push_back(std::move(acc));
  }
}

AccumulatorHooks::~AccumulatorHooks() {
  std::lock_guard<std::mutex> lock(target_->mutex);
  target_->call = nullptr;  // a backward after this one reaches no dangling object
}

}  // namespace sana::parallel
