#include "sana/train/optim/adafactor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace sana::train {

namespace {

torch::Tensor rms(const torch::Tensor& t) { return t.norm(2) / std::sqrt(static_cast<double>(t.numel())); }

}  // namespace

Adafactor::Adafactor(NamedParams params, AdafactorOptions o) : StatefulOptimizer(std::move(params)), o_(std::move(o)) {
  if (o_.eps.size() != 2) throw std::invalid_argument(fmt::format("Adafactor takes 2 eps values, got {}", o_.eps.size()));
  if (o_.warmup_init && !o_.relative_step) {
    throw std::invalid_argument("Adafactor: warmup_init needs relative_step (transformers' rule)");
  }
}

torch::Tensor Adafactor::inverse_root(const torch::Tensor& row, const torch::Tensor& col) {
  auto r = (row / row.mean(-1, true)).rsqrt_().unsqueeze(-1);
  return r * col.unsqueeze(-2).rsqrt();
}

void Adafactor::apply(double lr) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    const auto g = p.grad().to(torch::kFloat32);
    const auto shape = g.sizes();
    const bool fact = factored(shape);
    auto& s = state_[i];
    if (s.step == 0) {
      if (o_.beta1) s.get("exp_avg") = torch::zeros_like(g);
      if (fact) {
        std::vector<int64_t> col(shape.begin(), shape.end() - 2);
        col.push_back(shape.back());
        s.get("exp_avg_sq_row") = torch::zeros(shape.slice(0, shape.size() - 1), g.options());
        s.get("exp_avg_sq_col") = torch::zeros(col, g.options());
      } else {
        s.get("exp_avg_sq") = torch::zeros_like(g);
      }
    }
    auto w = p.scalar_type() == torch::kFloat32 ? p : p.to(torch::kFloat32);
    ++s.step;
    const auto t = static_cast<double>(s.step);
    const double rho = o_.relative_step ? std::min(o_.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t)) : lr;
    // The step size: a 0-dimensional tensor where it scales by the parameter's RMS (no
    // host round trip per parameter on a GPU).
    const auto size = o_.scale_parameter ? rms(w).clamp_min(o_.eps[1]).mul_(rho) : torch::full({}, rho, g.options());
    const double beta2t = 1.0 - std::pow(t, o_.decay_rate);
    auto u = g.square().add_(o_.eps[0]);
    if (fact) {
      auto& row = s.get("exp_avg_sq_row");
      auto& col = s.get("exp_avg_sq_col");
      row.mul_(beta2t).add_(u.mean(-1), 1.0 - beta2t);
      col.mul_(beta2t).add_(u.mean(-2), 1.0 - beta2t);
      u = inverse_root(row, col).mul_(g);
    } else {
      auto& v = s.get("exp_avg_sq");
      v.mul_(beta2t).add_(u, 1.0 - beta2t);
      u = v.rsqrt().mul_(g);
    }
    u.div_((rms(u) / o_.clip_threshold).clamp_(1.0));
    u.mul_(size);
    if (o_.beta1) {
      auto& m = s.get("exp_avg");
      m.mul_(*o_.beta1).add_(u, 1.0 - *o_.beta1);
      u = m;
    }
    if (o_.weight_decay != 0) w.add_(w * size, -o_.weight_decay);
    w.sub_(u);
    if (!w.is_same(p)) p.copy_(w);
  }
}

}  // namespace sana::train
