#include "sana/train/optim/prodigy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>

namespace sana::train {

namespace {

// Every slice_p-th element of `t`, flat (prodigyopt's t.flatten()[::slice_p]).
torch::Tensor sliced(const torch::Tensor& t, int64_t slice_p) {
  const auto flat = t.reshape({-1});
  return slice_p == 1 ? flat : flat.slice(0, 0, flat.numel(), slice_p);
}

// The rows summed down each column in row order, as prodigyopt adds its Python floats.
torch::Tensor sum_in_order(const torch::Tensor& rows) {
  auto out = torch::zeros({rows.size(1)}, torch::kFloat64);
  const auto r = rows.accessor<double, 2>();
  auto o = out.accessor<double, 1>();
  for (int64_t i = 0; i < rows.size(0); ++i) {
    for (int64_t j = 0; j < rows.size(1); ++j) o[j] += r[i][j];
  }
  return out;
}

}  // namespace

Prodigy::Prodigy(NamedParams params, ProdigyOptions o)
    : StatefulOptimizer(std::move(params)), o_(std::move(o)), d_(o_.d0), d_max_(o_.d0) {
  if (o_.betas.size() != 2 && o_.betas.size() != 3) {
    throw std::invalid_argument(fmt::format("Prodigy takes 2 or 3 betas, got {}", o_.betas.size()));
  }
  if (!(o_.d0 > 0)) throw std::invalid_argument(fmt::format("Prodigy: d0 must be above 0, got {}", o_.d0));
  if (o_.slice_p < 1) throw std::invalid_argument(fmt::format("Prodigy: slice_p must be at least 1, got {}", o_.slice_p));
  beta3_ = o_.betas.size() == 3 ? o_.betas[2] : std::sqrt(o_.betas[1]);
}

torch::Tensor Prodigy::first_pass(double lr, double dlr) {
  const double b1 = o_.betas[0], b2 = o_.betas[1];
  std::vector<torch::Tensor> numbers;
  const auto zero = torch::zeros({2});
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) {
      numbers.push_back(zero.to(p.device()));
      continue;
    }
    auto& st = state_[i];
    auto& g = p.mutable_grad();
    if (o_.weight_decay != 0 && !o_.decouple) g.add_(p, o_.weight_decay);  // coupled: into the gradient
    auto& s = st.get("s");
    if (!s.defined()) {
      s = torch::zeros_like(sliced(p, o_.slice_p));
      st.get("p0") = sliced(p, o_.slice_p).clone();
      if (b1 > 0) st.get("exp_avg") = torch::zeros_like(p);
      st.get("exp_avg_sq") = torch::zeros_like(p);
    }
    if (lr <= 0) {
      numbers.push_back(zero.to(p.device()));
      continue;
    }
    const auto g_sliced = sliced(g, o_.slice_p);
    const auto dot = torch::dot(g_sliced, st.get("p0") - sliced(p, o_.slice_p));
    if (b1 > 0) st.get("exp_avg").mul_(b1).add_(g, d_ * (1 - b1));
    st.get("exp_avg_sq").mul_(b2).addcmul_(g, g, d_ * d_ * (1 - b2));
    s.mul_(beta3_).add_(g_sliced, (d_ / o_.d0) * (o_.safeguard_warmup ? d_ : dlr));
    numbers.push_back(torch::stack({dot, s.abs().sum()}));
  }
  if (numbers.empty()) return torch::zeros({0, 2}, torch::kFloat64);
  // One trip to the host for every parameter's numbers (fp32, each taken to fp64 as
  // prodigyopt's .item() does).
  auto rows = torch::stack(numbers).to(torch::kCPU).to(torch::kFloat64);
  rows.select(1, 0).mul_((d_ / o_.d0) * dlr);
  return rows;
}

void Prodigy::apply(double lr) {
  torch::NoGradGuard no_grad;
  const double b1 = o_.betas[0], b2 = o_.betas[1];
  const double k = static_cast<double>(k_);
  const double bias_correction =
      o_.use_bias_correction ? std::sqrt(1 - std::pow(b2, k + 1)) / (1 - std::pow(b1, k + 1)) : 1.0;
  const double dlr = d_ * lr * bias_correction;
  const auto rows = first_pass(lr, dlr);
  const auto totals = sum_ ? sum_(rows) : sum_in_order(rows);
  const double delta = totals[0].item<double>(), denominator = totals[1].item<double>();
  if (denominator == 0) return;  // no progress to measure (every gradient zero, or lr 0)
  const double numerator = numerator_ * beta3_ + delta;
  const double d_hat = o_.d_coef * numerator / denominator;
  double d = d_;
  if (d == o_.d0) d = std::max(d, d_hat);
  d_max_ = std::max(d_max_, d_hat);
  d_ = std::min(d_max_, d * o_.growth_rate);
  numerator_ = numerator;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    auto& st = state_[i];
    ++st.step;
    const auto denom = st.get("exp_avg_sq").sqrt().add_(d_ * o_.eps);
    if (o_.weight_decay != 0 && o_.decouple) p.add_(p, -o_.weight_decay * dlr);
    if (b1 > 0) {
      p.addcdiv_(st.get("exp_avg"), denom, -dlr);
    } else {
      p.addcdiv_(p.grad(), denom, -dlr * d_);
    }
  }
  ++k_;
}

NamedParams Prodigy::state() const {
  const auto scalar = [](double v) { return torch::tensor({v}, torch::kFloat64); };
  return state_with({{"d", scalar(d_)},
                     {"d_max", scalar(d_max_)},
                     {"d_numerator", scalar(numerator_)},
                     {"k", torch::tensor({k_}, torch::kInt64)}});
}

void Prodigy::load_state(const NamedParams& saved) {
  const auto globals = load_state_with(saved, {"d", "d_max", "d_numerator", "k"});
  d_ = d_max_ = o_.d0;
  numerator_ = 0;
  k_ = 0;
  if (globals.empty()) return;  // nothing stepped yet
  d_ = globals.at("d").item<double>();
  d_max_ = globals.at("d_max").item<double>();
  numerator_ = globals.at("d_numerator").item<double>();
  k_ = globals.at("k").item<int64_t>();
}

}  // namespace sana::train
