#include "sana/train/optim/schedule_free.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace sana::train {

ScheduleFreeAdamW::ScheduleFreeAdamW(NamedParams params, ScheduleFreeOptions o)
    : StatefulOptimizer(std::move(params)), o_(std::move(o)) {
  if (o_.betas.size() != 2) {
    throw std::invalid_argument(fmt::format("ScheduleFreeAdamW takes 2 betas, got {}", o_.betas.size()));
  }
  if (!(o_.betas[0] > 0)) {
    throw std::invalid_argument(fmt::format("ScheduleFreeAdamW: beta1 must be above 0 (x is y and z's lerp by "
                                            "1 - 1/beta1), got {}", o_.betas[0]));
  }
  if (o_.warmup_steps < 0) {
    throw std::invalid_argument(fmt::format("ScheduleFreeAdamW: warmup_steps must be at least 0, got {}", o_.warmup_steps));
  }
}

void ScheduleFreeAdamW::apply(double lr) {
  torch::NoGradGuard no_grad;
  const double b1 = o_.betas[0], b2 = o_.betas[1];
  const double k1 = static_cast<double>(k_ + 1);
  const double sched = k_ < o_.warmup_steps ? k1 / static_cast<double>(o_.warmup_steps) : 1.0;
  const double bias_correction2 = 1 - std::pow(b2, k1);
  const double lr_k = lr * sched;
  lr_max_ = std::max(lr_k, lr_max_);
  const double weight = std::pow(k1, o_.r) * std::pow(lr_max_, o_.weight_lr_power);
  weight_sum_ += weight;
  const double ckp1 = weight_sum_ == 0 ? 0.0 : weight / weight_sum_;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& y = params_[i].second;
    if (!y.grad().defined()) continue;
    auto& st = state_[i];
    auto& z = st.get("z");
    auto& v = st.get("exp_avg_sq");
    if (!z.defined()) {
      z = y.detach().clone();
      v = torch::zeros_like(y);
    }
    ++st.step;
    const auto& g = y.grad();
    v.mul_(b2).addcmul_(g, g, 1 - b2);
    auto u = g / v.div(bias_correction2).sqrt_().add_(o_.eps);
    if (o_.weight_decay != 0) u.add_(y, o_.weight_decay);  // weight decay at y
    y.lerp_(z, ckp1);
    y.add_(u, lr_k * (b1 * (1 - ckp1) - 1));
    z.sub_(u, lr_k);
  }
  ++k_;
}

NamedParams ScheduleFreeAdamW::eval_weights() const {
  torch::NoGradGuard no_grad;
  NamedParams out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, y] = params_[i];
    const auto it = state_[i].tensors.find("z");
    if (it == state_[i].tensors.end() || !it->second.defined()) continue;  // never stepped: x is y
    out.emplace_back(name, y.detach().lerp(it->second, 1 - 1 / o_.betas[0]));
  }
  return out;
}

NamedParams ScheduleFreeAdamW::state() const {
  return state_with({{"k", torch::tensor({k_}, torch::kInt64)},
                     {"lr_max", torch::tensor({lr_max_}, torch::kFloat64)},
                     {"weight_sum", torch::tensor({weight_sum_}, torch::kFloat64)}});
}

void ScheduleFreeAdamW::load_state(const NamedParams& saved) {
  const auto globals = load_state_with(saved, {"k", "lr_max", "weight_sum"});
  k_ = 0;
  lr_max_ = -1.0;
  weight_sum_ = 0.0;
  if (globals.empty()) return;  // nothing stepped yet
  k_ = globals.at("k").item<int64_t>();
  lr_max_ = globals.at("lr_max").item<double>();
  weight_sum_ = globals.at("weight_sum").item<double>();
}

}  // namespace sana::train
