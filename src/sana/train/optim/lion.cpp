#include "sana/train/optim/lion.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace sana::train {

Lion::Lion(NamedParams params, std::vector<double> betas, double weight_decay)
    : StatefulOptimizer(std::move(params)), weight_decay_(weight_decay) {
  if (betas.size() != 2) throw std::invalid_argument(fmt::format("Lion takes 2 betas, got {}", betas.size()));
  beta1_ = betas[0];
  beta2_ = betas[1];
}

void Lion::apply(double lr) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g = p.grad();
    if (!g.defined()) continue;
    auto& s = state_[i];
    auto& m = s.get("exp_avg");
    if (!m.defined()) m = torch::zeros_like(p);
    ++s.step;
    p.mul_(1.0 - lr * weight_decay_);
    p.add_(m.mul(beta1_).add_(g, 1.0 - beta1_).sgn_(), -lr);
    m.mul_(beta2_).add_(g, 1.0 - beta2_);
  }
}

}  // namespace sana::train
