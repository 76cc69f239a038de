#include "sana/train/optim/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "sana/train/optim/adamw8bit.h"
#include "sana/train/optim/adafactor.h"
#include "sana/train/optim/lion.h"
#include "sana/train/optim/prodigy.h"
#include "sana/train/optim/schedule_free.h"
#include "sana/util/log.h"

namespace sana::train {

PartState Optimizer::save_state() const {
  NamedTensors cpu;
  if (checkpointed_) {
    for (const auto& [n, v] : state()) cpu.emplace_back(n, v.to(torch::kCPU).clone());
  }
  return {nullptr, std::move(cpu), {}};
}

void Optimizer::restore_state(const PartState* saved, const std::string& source) {
  const auto& tensors = PartState::tensors_of(saved);
  if (tensors.empty()) {
    log::warn_shared("resume_from {}: no optimizer state saved (ckpt.save_optimizer false); its moments restart", source);
  }
  load_state(tensors);
}

namespace {

// A matrix view of a factored parameter: 2-D as is, a 1x1 convolution as [out, in].
torch::Tensor as_matrix(const torch::Tensor& t) { return t.dim() == 2 ? t : t.reshape({t.size(0), t.size(1)}); }

// The rank-1 estimate of a matrix of positive entries from its row and column means.
torch::Tensor approx(const torch::Tensor& row, const torch::Tensor& col) {
  const auto r = (row / row.mean(-1, true)).rsqrt().unsqueeze(-1);
  const auto c = col.unsqueeze(-2).rsqrt();
  return r * c;
}

}  // namespace

NamedParams StatefulOptimizer::state() const {
  NamedParams out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& st = state_[i];
    if (st.step == 0) continue;
    out.emplace_back(params_[i].first + "/step", torch::tensor({st.step}, torch::kInt64));
    for (const auto& [n, t] : st.tensors) out.emplace_back(params_[i].first + "/" + n, t);
  }
  return out;
}

void StatefulOptimizer::load_state(const NamedParams& saved) {
  std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  std::vector<State> loaded(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string prefix = params_[i].first + "/";
    const auto step = by_name.find(prefix + "step");
    if (step == by_name.end()) continue;  // never stepped
    loaded[i].step = step->second.item<int64_t>();
    for (auto it = by_name.lower_bound(prefix); it != by_name.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      if (it->first == prefix + "step") continue;
      // 8-bit codes stay uint8; every other state tensor is fp32.
      const auto dtype = it->second.scalar_type() == torch::kUInt8 ? torch::kUInt8 : torch::kFloat32;
      loaded[i].tensors[it->first.substr(prefix.size())] = it->second.to(params_[i].second.device(), dtype).clone();
    }
  }
  for (const auto& [name, t] : saved) {
    const auto slash = name.rfind('/');
    const bool known = std::any_of(params_.begin(), params_.end(),
                                   [&](const auto& p) { return p.first == name.substr(0, slash); });
    if (!known) throw std::invalid_argument(fmt::format("optimizer state for unknown parameter '{}'", name));
  }
  state_ = std::move(loaded);
}

NamedParams StatefulOptimizer::state_with(const NamedParams& globals) const {
  auto out = StatefulOptimizer::state();  // not a kind's own, which calls this
  for (size_t i = 0; i < params_.size(); ++i) {
    if (state_[i].step == 0) continue;
    for (const auto& [name, value] : globals) out.emplace_back(params_[i].first + "/" + name, value);
  }
  return out;
}

std::map<std::string, torch::Tensor> StatefulOptimizer::load_state_with(const NamedParams& saved,
                                                                       const std::vector<std::string>& names) {
  NamedParams own;
  std::map<std::string, torch::Tensor> globals;
  for (const auto& [entry, t] : saved) {
    const auto state = entry.substr(entry.rfind('/') + 1);
    if (std::find(names.begin(), names.end(), state) != names.end()) {
      globals.emplace(state, t);
    } else {
      own.emplace_back(entry, t);
    }
  }
  StatefulOptimizer::load_state(own);
  if (globals.empty()) return globals;
  for (const auto& n : names) {
    if (!globals.count(n)) throw std::invalid_argument(fmt::format("{}'s state has no '{}'", name(), n));
  }
  return globals;
}

AdamW::AdamW(NamedParams params, std::vector<double> betas, double eps, double weight_decay, Fused fused)
    : StatefulOptimizer(std::move(params)),
      beta1_(betas.at(0)),
      beta2_(betas.at(1)),
      eps_(eps),
      weight_decay_(weight_decay),
      fused_(fused) {}

void AdamW::apply(double lr) {
  torch::NoGradGuard no_grad;
  if (params_.empty()) return;  // ZeRO: a rank that owns no parameter
  if (prepare_flat()) {
    flat_step(lr);
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    auto& st = state_[i];
    const auto& g = p.grad();
    auto& m = st.get("exp_avg");
    auto& v = st.get("exp_avg_sq");
    if (st.step == 0) {
      m = torch::zeros_like(p);
      v = torch::zeros_like(p);
    }
    ++st.step;
    p.mul_(1 - lr * weight_decay_);
    m.mul_(beta1_).add_(g, 1 - beta1_);
    v.mul_(beta2_).addcmul_(g, g, 1 - beta2_);
    const double bias1 = 1 - std::pow(beta1_, static_cast<double>(st.step));
    const double bias2 = 1 - std::pow(beta2_, static_cast<double>(st.step));
    const auto denom = (v.sqrt() / std::sqrt(bias2)).add_(eps_);
    p.addcdiv_(m, denom, -lr / bias1);
  }
}

void AdamW::load_state(const NamedParams& state) {
  StatefulOptimizer::load_state(state);
  for (auto& s : state_) AdamW8bit::to_fp32_moments(s.tensors);  // an AdamW8bit checkpoint's moments
  flat_ready_ = false;  // the loaded moments go into the flat tensors at the next step
}

void AdamW::use_flat_buckets(std::vector<parallel::FlatBucket> buckets) {
  buckets_ = std::move(buckets);
  flat_ready_ = false;
}

bool AdamW::prepare_flat() {
  if (flat_ready_) return true;
  if (buckets_.empty()) return false;
  size_t covered = 0;
  for (const auto& b : buckets_) covered += b.layout.params.size();
  const int64_t step = state_.front().step;
  const bool same_step = std::all_of(state_.begin(), state_.end(), [&](const State& s) { return s.step == step; });
  if (covered != params_.size() || !same_step) return false;
  exp_avg_.clear();
  exp_avg_sq_.clear();
  for (const auto& b : buckets_) {
    auto m = torch::zeros_like(b.params), v = torch::zeros_like(b.params);
    for (size_t i = 0; i < b.layout.params.size(); ++i) {
      auto& st = state_[b.layout.params[i]];
      const auto& p = params_[b.layout.params[i]].second;
      auto m_view = m.narrow(0, b.layout.offsets[i], p.numel()).view(p.sizes());
      auto v_view = v.narrow(0, b.layout.offsets[i], p.numel()).view(p.sizes());
      if (step > 0) {
        m_view.copy_(st.get("exp_avg"));
        v_view.copy_(st.get("exp_avg_sq"));
      }
      st.get("exp_avg") = m_view;
      st.get("exp_avg_sq") = v_view;
    }
    exp_avg_.push_back(m);
    exp_avg_sq_.push_back(v);
  }
  flat_ready_ = true;
  return true;
}

void AdamW::flat_step(double lr) {
  for (auto& st : state_) ++st.step;
  const double k = static_cast<double>(state_.front().step);
  if (fused_ == Fused::always || buckets_.front().params.is_cuda()) {
    std::vector<torch::Tensor> params, grads;
    for (auto& b : buckets_) {
      params.push_back(b.params);
      grads.push_back(b.grads);
    }
    if (steps_.size() != buckets_.size()) {
      steps_.clear();
      for (const auto& p : params) steps_.push_back(torch::zeros({}, p.options().dtype(torch::kFloat32)));
    }
    for (auto& t : steps_) t.fill_(k);  // a host value: no wait for the device
    at::_fused_adamw_(params, grads, exp_avg_, exp_avg_sq_, {}, steps_, lr, beta1_, beta2_, weight_decay_, eps_,
                      /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
  const double bias1 = 1 - std::pow(beta1_, k);
  const double bias2 = 1 - std::pow(beta2_, k);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& p = buckets_[b].params;
    const auto& g = buckets_[b].grads;
    auto& m = exp_avg_[b];
    auto& v = exp_avg_sq_[b];
    if (weight_decay_ != 0) p.mul_(1 - lr * weight_decay_);
    m.mul_(beta1_).add_(g, 1 - beta1_);
    v.mul_(beta2_).addcmul_(g, g, 1 - beta2_);
    const auto denom = (v.sqrt() / std::sqrt(bias2)).add_(eps_);
    p.addcdiv_(m, denom, -lr / bias1);
  }
}

Came::Came(NamedParams params, std::vector<double> betas, std::vector<double> eps, double weight_decay,
           double clip_threshold, EightBitState eight_bit)
    : StatefulOptimizer(std::move(params)),
      beta1_(betas.at(0)),
      beta2_(betas.at(1)),
      beta3_(betas.at(2)),
      eps1_(eps.at(0)),
      eps2_(eps.at(1)),
      weight_decay_(weight_decay),
      clip_(clip_threshold),
      eight_bit_(eight_bit) {}

bool Came::factored(at::IntArrayRef s) {
  return s.size() == 2 || (s.size() == 4 && s[2] == 1 && s[3] == 1);
}

bool EightBitState::applies(at::IntArrayRef s) const {
  return on && Came::factored(s) && s[0] * s[1] > min_size;
}

namespace {

// Upstream's min-max quantization of a matrix in chunks of `rows` rows. A chunk of equal
// values (scale 0) gets codes 0: upstream divides 0 by 0 there, and any code dequantizes
// to its min.
void quantize(const torch::Tensor& m, int64_t rows, torch::Tensor& codes, torch::Tensor& scale,
              torch::Tensor& min) {
  const auto chunks = m.split(rows);
  codes = torch::empty(m.sizes(), m.options().dtype(torch::kUInt8));
  scale = torch::empty({static_cast<int64_t>(chunks.size())}, m.options());
  min = torch::empty_like(scale);
  int64_t row = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const auto& c = chunks[k];
    const auto lo = c.min(), hi = c.max();
    const auto sc = (hi - lo) / 255;
    // No host sync for the scale-0 case: where() picks 0 over the NaN of 0 / 0.
    codes.narrow(0, row, c.size(0)).copy_(torch::where(sc != 0, ((c - lo) / sc).round(), torch::zeros_like(c)));
    scale[static_cast<int64_t>(k)].copy_(sc);
    min[static_cast<int64_t>(k)].copy_(lo);
    row += c.size(0);
  }
}

torch::Tensor dequantize(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& min,
                         int64_t rows) {
  std::vector<torch::Tensor> parts;
  const auto chunks = codes.split(rows);
  for (size_t k = 0; k < chunks.size(); ++k) {
    parts.push_back(chunks[k].to(torch::kFloat32) * scale[static_cast<int64_t>(k)] + min[static_cast<int64_t>(k)]);
  }
  return torch::cat(parts);
}

// Upstream's _rms: the 2-norm over the square root of the element count.
torch::Tensor rms(const torch::Tensor& t) { return t.norm(2) / std::sqrt(static_cast<double>(t.numel())); }

}  // namespace

torch::Tensor Came::first_moment(State& s, const torch::Tensor& like, bool quantized) const {
  const auto codes = s.tensors.find("exp_avg.codes");
  const auto plain = s.tensors.find("exp_avg");
  if (quantized && codes != s.tensors.end()) {
    return dequantize(codes->second, s.get("exp_avg.scale"), s.get("exp_avg.min"), eight_bit_.block_rows);
  }
  if (!quantized && plain != s.tensors.end()) return plain->second;
  // A checkpoint of the other kind (CAME <-> CAME8bit), or a first step.
  torch::Tensor m = torch::zeros_like(like);
  if (codes != s.tensors.end()) {
    m = dequantize(codes->second, s.get("exp_avg.scale"), s.get("exp_avg.min"), eight_bit_.block_rows);
  } else if (plain != s.tensors.end()) {
    m = plain->second;
  }
  for (const char* n : {"exp_avg", "exp_avg.codes", "exp_avg.scale", "exp_avg.min"}) s.tensors.erase(n);
  return m;
}

void Came::keep_first_moment(State& s, const torch::Tensor& m, bool quantized) const {
  if (quantized) {
    quantize(m, eight_bit_.block_rows, s.get("exp_avg.codes"), s.get("exp_avg.scale"), s.get("exp_avg.min"));
  } else {
    s.get("exp_avg") = m;
  }
}

// Upstream's CAMEWrapper / CAME8BitWrapper step with the order of its roundings kept (a
// python3-torch transcription agrees to the last bit), over all parameters at once: each
// element-wise operation is one ATen _foreach_ call over the factored (or the other)
// parameters instead of one kernel per parameter. What stays per parameter: the row and
// column means and their rank-1 estimate (a reduction along one dimension of each matrix),
// each update's RMS, and the 8-bit first moment's chunked min-max codes. The foreach calls
// apply the same element-wise kernels, so grouping changes no bit.
// The parameters of one kind (factored or not) that have gradients this step: their
// indices, fp32 gradients (matrices where factored), first moments and updates.
struct Came::Group {
  bool factored = false;
  std::vector<size_t> index;
  std::vector<torch::Tensor> grad, m, update;
};

void Came::apply(double lr) {
  torch::NoGradGuard no_grad;
  Group fac, plain;
  fac.factored = true;
  collect(fac, plain);
  std::vector<torch::Tensor> params, steps;
  for (auto* g : {&fac, &plain}) {
    if (g->index.empty()) continue;
    update_moments(*g);
    for (size_t k = 0; k < g->index.size(); ++k) {
      auto& p = params_[g->index[k]].second;
      keep_first_moment(state_[g->index[k]], g->m[k], eight_bit_.applies(p.sizes()));
      params.push_back(p);
    }
    const auto dir = directions(*g, lr);
    steps.insert(steps.end(), dir.begin(), dir.end());
  }
  if (params.empty()) return;
  if (weight_decay_ != 0) at::_foreach_add_(params, params, -weight_decay_ * lr);
  for (size_t k = 0; k < params.size(); ++k) steps[k] = steps[k].reshape(params[k].sizes()).to(params[k].scalar_type());
  at::_foreach_sub_(params, steps);
}

void Came::collect(Group& fac, Group& plain) {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    auto& s = state_[i];
    const bool f = factored(p.sizes());
    const auto grad = f ? as_matrix(p.grad()).to(torch::kFloat32) : p.grad().to(torch::kFloat32);
    if (s.step == 0) {
      if (f) {
        for (const char* n : {"exp_avg_sq_row", "exp_avg_res_row"}) s.get(n) = torch::zeros({grad.size(0)}, grad.options());
        for (const char* n : {"exp_avg_sq_col", "exp_avg_res_col"}) s.get(n) = torch::zeros({grad.size(1)}, grad.options());
      } else {
        s.get("exp_avg_sq") = torch::zeros_like(grad);
      }
    }
    ++s.step;
    auto& g = f ? fac : plain;
    g.index.push_back(i);
    g.grad.push_back(grad);
    g.m.push_back(first_moment(s, grad, eight_bit_.applies(p.sizes())));
  }
}

std::vector<torch::Tensor> Came::states(const Group& g, const char* name) {
  std::vector<torch::Tensor> out;
  for (size_t i : g.index) out.push_back(state_[i].get(name));
  return out;
}

// state = beta * state + (1 - beta) * mean(v, dim), per row and per column; returns their
// rank-1 estimate of each matrix.
std::vector<torch::Tensor> Came::running_means(const Group& g, const std::vector<torch::Tensor>& v, const char* row,
                                               const char* col, double beta) {
  std::vector<torch::Tensor> rows = states(g, row), cols = states(g, col), row_means, col_means;
  for (const auto& t : v) {
    row_means.push_back(t.mean(1));
    col_means.push_back(t.mean(0));
  }
  at::_foreach_mul_(rows, beta);
  at::_foreach_add_(rows, row_means, 1.0 - beta);
  at::_foreach_mul_(cols, beta);
  at::_foreach_add_(cols, col_means, 1.0 - beta);
  std::vector<torch::Tensor> estimate;
  for (size_t k = 0; k < rows.size(); ++k) estimate.push_back(approx(rows[k], cols[k]));
  return estimate;
}

// The second moment, the update it scales (its RMS clipped) and the first moment.
void Came::update_moments(Group& g) {
  g.update = at::_foreach_mul(g.grad, g.grad);
  at::_foreach_add_(g.update, eps1_);
  if (g.factored) {
    g.update = running_means(g, g.update, "exp_avg_sq_row", "exp_avg_sq_col", beta2_);
  } else {
    auto sq = states(g, "exp_avg_sq");
    at::_foreach_mul_(sq, beta2_);
    at::_foreach_add_(sq, g.update, 1.0 - beta2_);
    g.update = at::_foreach_rsqrt(sq);
  }
  at::_foreach_mul_(g.update, g.grad);
  // Clip each update's RMS at clip_threshold (as Adafactor), on the device: reading the
  // RMS back would make the host wait for the device once per parameter.
  // (Each RMS on its own: CUDA divides by a host scalar as a product with its reciprocal.)
  std::vector<torch::Tensor> each;
  for (const auto& u : g.update) each.push_back(rms(u));
  const auto divisor = (torch::stack(each) / clip_).clamp_(1.0).unbind();
  for (size_t k = 0; k < g.update.size(); ++k) g.update[k].div_(divisor[k]);
  at::_foreach_mul_(g.m, beta1_);
  at::_foreach_add_(g.m, g.update, 1 - beta1_);
}

// Each parameter's step, lr included: the first moment, scaled where factored by the
// confidence (how far the update is from its running mean, factored as well).
std::vector<torch::Tensor> Came::directions(Group& g, double lr) {
  if (!g.factored) return at::_foreach_mul(g.m, lr);
  auto res = at::_foreach_sub(g.update, g.m);
  res = at::_foreach_mul(res, res);
  at::_foreach_add_(res, eps2_);
  auto dir = running_means(g, res, "exp_avg_res_row", "exp_avg_res_col", beta3_);
  at::_foreach_mul_(dir, g.m);
  at::_foreach_mul_(dir, lr);
  return dir;
}

const char* optimizer_name(OptimizerOptions::Kind kind) {
  switch (kind) {
    case OptimizerOptions::Kind::AdamW: return "AdamW";
    case OptimizerOptions::Kind::CAME: return "CAME";
    case OptimizerOptions::Kind::CAME8bit: return "CAME8bit";
    case OptimizerOptions::Kind::AdamW8bit: return "AdamW8bit";
    case OptimizerOptions::Kind::Lion: return "Lion";
    case OptimizerOptions::Kind::Adafactor: return "Adafactor";
    case OptimizerOptions::Kind::Prodigy: return "Prodigy";
    case OptimizerOptions::Kind::ScheduleFreeAdamW: return "ScheduleFreeAdamW";
  }
  return "?";
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o, const NamedParams& params) {
  using Kind = OptimizerOptions::Kind;
  if (o.came()) return std::make_unique<Came>(params, o.betas, o.eps, o.weight_decay, 1.0, EightBitState::of(o));
  if (o.type == Kind::AdamW) return std::make_unique<AdamW>(params, o.betas, o.eps.at(0), o.weight_decay);
  if (o.type == Kind::AdamW8bit) {
    return std::make_unique<AdamW8bit>(params, o.betas, o.eps.at(0), o.weight_decay, o.min_8bit_size);
  }
  if (o.type == Kind::Lion) return std::make_unique<Lion>(params, o.betas, o.weight_decay);
  if (o.type == Kind::Adafactor) {
    AdafactorOptions a;
    a.eps = o.eps;
    a.clip_threshold = o.clip_threshold;
    a.decay_rate = o.decay_rate;
    if (!o.betas.empty()) a.beta1 = o.betas.at(0);
    a.weight_decay = o.weight_decay;
    a.scale_parameter = o.scale_parameter;
    a.relative_step = o.relative_step;
    a.warmup_init = o.warmup_init;
    return std::make_unique<Adafactor>(params, a);
  }
  if (o.type == Kind::Prodigy) {
    return std::make_unique<Prodigy>(params, ProdigyOptions{o.betas, o.eps.at(0), o.weight_decay, o.decouple,
                                                           o.use_bias_correction, o.safeguard_warmup, o.d0, o.d_coef,
                                                           o.growth_rate, o.slice_p});
  }
  if (o.type == Kind::ScheduleFreeAdamW) {
    return std::make_unique<ScheduleFreeAdamW>(
        params, ScheduleFreeOptions{o.betas, o.eps.at(0), o.weight_decay, o.warmup_steps, o.r, o.weight_lr_power});
  }
  throw std::invalid_argument(
      fmt::format("train.optimizer.type: unknown optimizer {}", static_cast<int>(o.type)));
}

}  // namespace sana::train
