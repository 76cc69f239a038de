#include "sana/train/optim/adamw8bit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace sana::train {

namespace {

// A flat float32 view of `t`'s elements padded with `pad` (a scalar tensor) to whole blocks.
torch::Tensor in_blocks(const torch::Tensor& flat, const torch::Tensor& pad) {
  const int64_t n = flat.numel(), blocks = (n + AdamW8bit::kBlock - 1) / AdamW8bit::kBlock;
  const int64_t extra = blocks * AdamW8bit::kBlock - n;
  auto full = extra == 0 ? flat : torch::cat({flat, pad.reshape({1}).expand({extra})});
  return full.view({blocks, AdamW8bit::kBlock});
}

// Each element's block's value of `per_block`.
torch::Tensor per_element(const torch::Tensor& per_block, int64_t n) {
  return per_block.repeat_interleave(AdamW8bit::kBlock).narrow(0, 0, n);
}

// The first moment's codes: the nearest entry of the signed `map` to m / absmax, moved one
// step towards m's sign where the entry's sign differs (bitsandbytes' kernel does so; a
// negative m that rounds to +0 keeps a negative code).
torch::Tensor first_moment_codes(const torch::Tensor& m, const torch::Tensor& absmax, const torch::Tensor& map) {
  auto k = AdamW8bit::nearest_code(m / per_element(absmax, m.numel()), map);
  const auto flip = torch::signbit(map.index({k})) != torch::signbit(m);
  const auto towards = torch::where(m > 0, torch::ones_like(k), -torch::ones_like(k));
  return torch::where(flip, (k + towards).remainder(256), k).to(torch::kUInt8);
}

}  // namespace

AdamW8bit::AdamW8bit(NamedParams params, std::vector<double> betas, double eps, double weight_decay, int64_t min_size)
    : StatefulOptimizer(std::move(params)),
      beta1_(static_cast<float>(betas.at(0))),
      beta2_(static_cast<float>(betas.at(1))),
      eps_(static_cast<float>(eps)),
      weight_decay_(static_cast<float>(weight_decay)),
      min_size_(min_size) {}

torch::Tensor AdamW8bit::dynamic_map(bool is_signed) {
  // bitsandbytes' create_dynamic_map with 7 exponent bits of 8: for each decade 1e-6 .. 1,
  // the midpoints of an even split of [0.1, 1] (2^i of them signed, 2^(i+1) unsigned),
  // scaled by the decade (and negated, signed); then 0 and 1.
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const auto bounds = torch::linspace(0.1, 1, items, torch::kFloat32);
    const auto means = (bounds.narrow(0, 0, items - 1) + bounds.narrow(0, 1, items - 1)) / 2.0;
    const double decade = std::pow(10.0, -6 + i);
    for (const double sign : {1.0, -1.0}) {
      if (sign < 0 && !is_signed) break;
      const auto scaled = (sign * decade) * means;
      const auto* v = scaled.data_ptr<float>();
      data.insert(data.end(), v, v + scaled.numel());
    }
  }
  data.push_back(0.0F);
  data.push_back(1.0F);
  if (data.size() != 256) throw std::logic_error("dynamic_map: not 256 values");
  std::sort(data.begin(), data.end());
  return torch::tensor(data, torch::kFloat32);
}

torch::Tensor AdamW8bit::nearest_code(const torch::Tensor& x, const torch::Tensor& map) {
  // bitsandbytes' binary search (quantize_2D) lands between the midpoints of neighbouring
  // entries, an exact midpoint on the even index of the two; NaN (0 / 0) on code 0.
  const auto mids = (map.narrow(0, 0, 255) + map.narrow(0, 1, 255)) * 0.5;
  auto k = torch::searchsorted(mids, x.contiguous());  // how many midpoints lie below x
  const auto at = mids.index({k.clamp_max(254)});
  const auto tie = (k < 255).logical_and(x == at).logical_and(k.remainder(2) == 1);
  k = torch::where(tie, k + 1, k);
  return torch::where(torch::isnan(x), torch::zeros_like(k), k);
}

torch::Tensor AdamW8bit::dequantize(const torch::Tensor& codes, const torch::Tensor& absmax, bool is_signed) {
  const auto map = dynamic_map(is_signed).to(codes.device());
  const auto flat = map.index({codes.reshape({-1}).to(torch::kLong)}) * per_element(absmax, codes.numel());
  return flat.view(codes.sizes());
}

void AdamW8bit::to_fp32_moments(std::map<std::string, torch::Tensor>& state) {
  if (state.count("exp_avg.codes") == 0) return;
  state["exp_avg"] = dequantize(state.at("exp_avg.codes"), state.at("exp_avg.absmax"), true);
  state["exp_avg_sq"] = dequantize(state.at("exp_avg_sq.codes"), state.at("exp_avg_sq.absmax"), false);
  for (const char* n : {"exp_avg.codes", "exp_avg.absmax", "exp_avg_sq.codes", "exp_avg_sq.absmax"}) state.erase(n);
}

// One parameter at a time, unlike AdamW's and CAME's multi-tensor steps: each quantized
// parameter's moments are its own 256-element blocks (a short last block padded, its own
// absmax per block), so the dequantize-update-requantize chain is shaped by the tensor and
// no _foreach_ call spans two of them; the fp32 ones are the few small tensors under
// min_size (biases, norms), a handful of launches.
void AdamW8bit::apply(double lr) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    auto& s = state_[i];
    const auto g = p.grad().reshape({-1}).to(torch::kFloat32);
    ++s.step;
    if (quantized(p)) {
      step_8bit(s, p, g, static_cast<float>(lr));
    } else {
      step_32bit(s, p, g, static_cast<float>(lr));
    }
  }
}

void AdamW8bit::step_32bit(State& s, torch::Tensor& p, const torch::Tensor& g, float lr) {
  auto& m = s.get("exp_avg");
  auto& v = s.get("exp_avg_sq");
  if (!m.defined()) m = torch::zeros_like(g).view(p.sizes());
  if (!v.defined()) v = torch::zeros_like(g).view(p.sizes());
  const float t = static_cast<float>(s.step);
  const float c1 = 1.0F - std::pow(beta1_, t), c2 = std::sqrt(1.0F - std::pow(beta2_, t));
  const float step_size = -lr * c2 / c1;
  const auto grad = g.view(p.sizes());
  m = m * static_cast<double>(beta1_) + grad * static_cast<double>(1.0F - beta1_);
  v = v * static_cast<double>(beta2_) + (grad * grad) * static_cast<double>(1.0F - beta2_);
  auto q = m / (v.sqrt() + static_cast<double>(eps_ * c2));
  auto next = p + q * static_cast<double>(step_size);
  if (weight_decay_ > 0) next = next * static_cast<double>(1.0F - lr * weight_decay_);
  p.copy_(next);
}

void AdamW8bit::step_8bit(State& s, torch::Tensor& p, const torch::Tensor& g, float lr) {
  if (!map1_.defined() || map1_.device() != p.device()) {
    map1_ = dynamic_map(true).to(p.device());
    map2_ = dynamic_map(false).to(p.device());
  }
  const int64_t n = g.numel(), blocks = (n + kBlock - 1) / kBlock;
  if (s.tensors.count("exp_avg") != 0) {  // fp32 moments from an AdamW checkpoint
    quantize_moments(s, s.get("exp_avg").reshape({-1}), s.get("exp_avg_sq").reshape({-1}));
  }
  auto& codes1 = s.get("exp_avg.codes");
  auto& absmax1 = s.get("exp_avg.absmax");
  auto& codes2 = s.get("exp_avg_sq.codes");
  auto& absmax2 = s.get("exp_avg_sq.absmax");
  if (!codes1.defined()) {
    codes1 = torch::zeros(p.sizes(), p.options().dtype(torch::kUInt8));
    codes2 = torch::zeros(p.sizes(), p.options().dtype(torch::kUInt8));
    absmax1 = torch::zeros({blocks}, g.options());
    absmax2 = torch::zeros({blocks}, g.options());
  }
  const double b1 = beta1_, b2 = beta2_, one_b1 = 1.0F - beta1_, one_b2 = 1.0F - beta2_;
  const auto finite = torch::isfinite(g);
  const auto m_old = map1_.index({codes1.reshape({-1}).to(torch::kLong)}) * per_element(absmax1, n);
  const auto v_old = map2_.index({codes2.reshape({-1}).to(torch::kLong)}) * per_element(absmax2, n);
  auto v = v_old * b2 + (g * one_b2) * g;
  auto m = m_old * b1 + g * one_b1;
  m = torch::where(finite, m, torch::zeros_like(m));
  v = torch::where(finite, v, torch::zeros_like(v));
  // The new absmax over every lane of a block: a short last block's padding lanes hold
  // code1[128] (the smallest positive entry) times the old absmax times b1.
  const auto pad1 = map1_[128] * absmax1[blocks - 1] * b1 + 0.0;
  const auto new1 = in_blocks(m, pad1).abs().amax(1);
  const auto new2 = in_blocks(v, torch::zeros({}, g.options())).amax(1);
  const float t = static_cast<float>(s.step);
  const float c1 = 1.0F - std::pow(beta1_, t), c2 = std::sqrt(1.0F - std::pow(beta2_, t));
  const float step_size = -lr * c2 / c1;
  const auto flat_p = p.view({-1});
  auto next = flat_p + (m / (v.sqrt() + static_cast<double>(c2 * eps_))) * static_cast<double>(step_size);
  if (weight_decay_ > 0) next = next * static_cast<double>(1.0F - lr * weight_decay_);
  flat_p.copy_(torch::where(finite, next, flat_p));
  // The moments back to codes, scaled by the new absmax.
  codes1 = first_moment_codes(m, new1, map1_).view(p.sizes());
  codes2 = nearest_code(v / per_element(new2, n), map2_).to(torch::kUInt8).view(p.sizes());
  absmax1 = new1;
  absmax2 = new2;
}

void AdamW8bit::quantize_moments(State& s, const torch::Tensor& m, const torch::Tensor& v) const {
  const auto zero = torch::zeros({}, m.options());
  const int64_t n = m.numel();
  const auto a1 = in_blocks(m.to(torch::kFloat32), zero).abs().amax(1);
  const auto a2 = in_blocks(v.to(torch::kFloat32), zero).amax(1);
  const auto map1 = dynamic_map(true).to(m.device()), map2 = dynamic_map(false).to(m.device());
  const auto shape = s.get("exp_avg").sizes().vec();
  s.get("exp_avg.codes") = first_moment_codes(m, a1, map1).view(shape);
  s.get("exp_avg_sq.codes") = nearest_code(v / per_element(a2, n), map2).to(torch::kUInt8).view(shape);
  s.get("exp_avg.absmax") = a1;
  s.get("exp_avg_sq.absmax") = a2;
  s.tensors.erase("exp_avg");
  s.tensors.erase("exp_avg_sq");
}

}  // namespace sana::train
