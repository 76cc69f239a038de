#include "sana/train/sprint/objective.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "sana/model/trigflow.h"

namespace sana::train {

namespace {

using torch::Tensor;

// Per-sample values as [b, 1, 1, 1] (`flat`: [b]) in `like`'s dtype and device.
Tensor column(const std::vector<double>& v, const Tensor& like, bool flat = false) {
  auto t = torch::tensor(v, torch::kFloat64).to(like.device(), like.scalar_type());
  return flat ? t : t.view({-1, 1, 1, 1});
}

Tensor stacked(const std::vector<Tensor>& noises, const Tensor& like) {
  return torch::stack(noises).to(like.device(), like.scalar_type());
}

// x0 noised to TrigFlow time s: cos s x0 + sin s sigma_d z.
Tensor noised(const Tensor& x0, const Tensor& s, const Tensor& z, double sigma_d) {
  return torch::cos(s) * x0 + torch::sin(s) * sigma_d * z;
}

// The student's x0 from its output F at (x_s, s): cos s x_s - sin s sigma_d F.
Tensor predicted_x0(const Tensor& x_s, const Tensor& s, const Tensor& F, double sigma_d) {
  return torch::cos(s) * x_s - torch::sin(s) * sigma_d * F;
}

model::Condition with_cfg(const model::Condition& c, const std::vector<double>& cfg, const Tensor& like) {
  auto out = c;
  out.cfg_scale = column(cfg, like, true);
  return out;
}

// The teacher's guided velocity dx_s/ds = sigma_d (F_u + w (F_c - F_u)), one batched pass
// over [null caption; caption] as upstream's.
Tensor teacher_velocity(model::SanaMSImpl& teacher, const Tensor& x_s, const Tensor& s, const model::Condition& c,
                        const Tensor& w, double sigma_d) {
  torch::NoGradGuard no_grad;
  // An unconditional teacher has no null branch: its one output is the guided one.
  if (!c.y.defined()) return sigma_d * model::trigflow_forward(teacher, x_s / sigma_d, s.flatten(), c);
  const int64_t b = x_s.size(0);
  model::Condition both;
  both.y = torch::cat({c.y, c.y});
  if (c.mask.defined()) both.mask = torch::cat({c.mask, c.mask});
  const auto on = torch::TensorOptions().dtype(torch::kBool).device(x_s.device());
  both.drop = torch::cat({torch::ones({b}, on), torch::zeros({b}, on)});
  const auto F = model::trigflow_forward(teacher, torch::cat({x_s, x_s}) / sigma_d, torch::cat({s, s}).flatten(), both);
  const auto u = F.narrow(0, 0, b), cnd = F.narrow(0, b, b);
  return sigma_d * (u + w * (cnd - u));
}

// Rows [first, first + n) of each of `per_head` (one [rows, N, C] per head).
std::vector<Tensor> rows_of(const std::vector<Tensor>& per_head, int64_t first, int64_t n) {
  std::vector<Tensor> out;
  for (const auto& t : per_head) out.push_back(t.narrow(0, first, n));
  return out;
}

// A sum over ranks as an autograd function: forward and backward both all-reduce.
struct RankSum : public torch::autograd::Function<RankSum> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                        const std::shared_ptr<std::function<void(Tensor&)>>& reduce) {
    ctx->saved_data["reduce"] = reinterpret_cast<int64_t>(reduce.get());
    auto out = x.clone();
    (*reduce)(out);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* reduce = reinterpret_cast<const std::function<void(Tensor&)>*>(ctx->saved_data["reduce"].toInt());
    auto g = grads[0].clone();
    (*reduce)(g);
    return {g, Tensor()};
  }
};

}  // namespace

std::function<Tensor(const Tensor&)> summed_over_ranks(std::function<void(Tensor&)> all_reduce) {
  auto reduce = std::make_shared<std::function<void(Tensor&)>>(std::move(all_reduce));
  return [reduce](const Tensor& x) { return RankSum::apply(x, reduce); };
}

// The heads' inputs of a phase: per head, this rank's rows of every micro-batch, and where
// those rows are in the phase's whole batch.
struct SprintObjective::Features {
  std::vector<std::vector<Tensor>> parts;  // per micro-batch run, per head: [rows, N, C]
  std::vector<int64_t> positions;

  void add(std::vector<Tensor> heads, int64_t place) {
    for (int64_t i = 0; i < heads.front().size(0); ++i) positions.push_back(place + i);
    parts.push_back(std::move(heads));
  }
  // Per head, every part's rows in order, as leaves that take gradients when `grad`.
  std::vector<Tensor> joined(bool grad) const {
    std::vector<Tensor> out;
    for (size_t h = 0; h < parts.front().size(); ++h) {
      std::vector<Tensor> rows;
      for (const auto& p : parts) rows.push_back(p[h]);
      out.push_back(torch::cat(rows).detach().requires_grad_(grad));
    }
    return out;
  }
};

SprintObjective::SprintObjective(SprintOptions options, model::SanaMS student, model::SanaMS teacher, model::LaddHeads heads,
                       AllReduce all_reduce)
    : o_(std::move(options)), student_(std::move(student)), teacher_(std::move(teacher)), heads_(std::move(heads)),
      all_reduce_(std::move(all_reduce)) {
  if (all_reduce_) sum_ = summed_over_ranks(all_reduce_);
  if (o_.head_blocks.empty()) throw std::invalid_argument("SANA-Sprint: model.head_block_ids names no teacher block");
  if (static_cast<int64_t>(heads_->heads->size()) != static_cast<int64_t>(o_.head_blocks.size())) {
    throw std::invalid_argument(fmt::format("SANA-Sprint: {} discriminator heads for {} teacher blocks",
                                            heads_->heads->size(), o_.head_blocks.size()));
  }
  for (auto& p : teacher_->parameters()) p.set_requires_grad(false);
  teacher_->eval();
}

model::BatchGroups SprintObjective::groups(const Features& rows, int64_t total, const model::HeadReplicas* replicas) const {
  if (o_.exact) {
    std::vector<int64_t> chunks;
    for (const auto& p : rows.parts) chunks.push_back(p.front().size(0));
    return model::exact_batch_groups(rows.positions, total, o_.virtual_bs, std::move(chunks), all_reduce_, replicas);
  }
  auto g = model::batch_groups(rows.positions, total, o_.virtual_bs);
  g.sum = sum_;
  return g;
}

void SprintObjective::hand_over(const model::HeadReplicas& replicas, bool last) {
  torch::NoGradGuard no_grad;
  auto params = heads_->parameters();
  for (size_t c = 0; c < replicas.chunks(); ++c) {
    if (before_backward_) before_backward_(last && c + 1 == replicas.chunks());
    const auto grads = replicas.gradients(c);
    for (size_t i = 0; i < params.size(); ++i) {
      auto& g = params[i].mutable_grad();
      if (g.defined()) {
        g.add_(grads[i]);  // zero after the reducer took the chunk before
      } else {
        g = grads[i].clone();
      }
    }
  }
}

struct SprintObjective::MicroDraws {
  Tensor s, s_x0, s_d, z, z_x0, z_d, w;  // [b, 1, 1, 1] times and scales, [b, C, H, W] noises
  std::vector<double> cfg;
};

SprintObjective::MicroDraws SprintObjective::generator_draws(const SprintMicroBatch& m, int64_t step) const {
  MicroDraws d;
  std::vector<double> s, s_x0, s_d;
  std::vector<Tensor> z, z_x0, z_d;
  for (const auto id : m.ids) {
    const auto g = diffusion::generator_draws({o_.seed, step, id}, o_.draws, m.x0.sizes().slice(1));
    s.push_back(g.s);
    s_x0.push_back(g.s_x0);
    s_d.push_back(g.s_d);
    d.cfg.push_back(g.cfg);
    z.push_back(g.z);
    z_d.push_back(g.z_d);
    if (g.z_x0.defined()) z_x0.push_back(g.z_x0);
  }
  d.s = column(s, m.x0);
  d.s_x0 = column(s_x0, m.x0);
  d.s_d = column(s_d, m.x0);
  d.w = column(d.cfg, m.x0);
  d.z = stacked(z, m.x0);
  d.z_d = stacked(z_d, m.x0);
  if (!z_x0.empty()) d.z_x0 = stacked(z_x0, m.x0);
  return d;
}

std::vector<Tensor> SprintObjective::fake_features(const SprintMicroBatch& m, const MicroDraws& d) {
  const double sd = o_.sigma_data;
  // Without train_largest_timestep the prediction is the sCM forward's own (x_s at s), as upstream.
  const auto x_s = noised(m.x0, d.s_x0, d.z_x0.defined() ? d.z_x0 : d.z, sd);
  const auto F = model::trigflow_forward(*student_, x_s / sd, d.s_x0.flatten(), with_cfg(m.cond, d.cfg, m.x0));
  const auto fake = noised(predicted_x0(x_s, d.s_x0, F, sd), d.s_d, d.z_d, sd);
  return model::trigflow_block_outputs(*teacher_, fake / sd, d.s_d.flatten(), m.cond, o_.head_blocks);
}

std::vector<Tensor> SprintObjective::adversarial_gradients(const SprintShare& share, const std::vector<MicroDraws>& draws,
                                                      Tensor* adv) {
  Features features;
  int64_t place = share.first;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < share.micro.size(); ++i) {
      features.add(fake_features(share.micro[i], draws[i]), place);
      place += share.micro[i].x0.size(0);
    }
  }
  const auto leaves = features.joined(true);
  const auto g = groups(features, share.global_batch);
  const auto logits = heads_->forward(leaves, &g);
  const auto loss = -logits.sum() / static_cast<double>(share.global_batch * logits.size(1));
  *adv = loss.detach().to(torch::kCPU, torch::kFloat64);
  return torch::autograd::grad({loss}, leaves);  // the heads' parameters take nothing
}

Tensor SprintObjective::generator_backward(const SprintMicroBatch& m, const MicroDraws& d, double r, int64_t global_batch,
                                      const std::vector<Tensor>& feature_grads, bool last) {
  const double sd = o_.sigma_data;
  const auto cond = with_cfg(m.cond, d.cfg, m.x0);
  const auto x_s = noised(m.x0, d.s, d.z, sd);
  const auto dxds = teacher_velocity(*teacher_, x_s, d.s, m.cond, d.w, sd);
  const auto cs = torch::cos(d.s) * torch::sin(d.s);
  const auto jvp = model::trigflow_jvp(*student_, x_s / sd, d.s.flatten(), cond, cs * dxds / sd, cs.flatten());
  Tensor logvar;
  const auto F = model::trigflow_forward(*student_, x_s / sd, d.s.flatten(), cond, &logvar);
  const auto dir = diffusion::scm_direction(F.detach(), jvp.tangent, dxds, x_s, d.s.flatten(), r, sd);
  const double share = static_cast<double>(m.x0.size(0)) / static_cast<double>(global_batch);
  const auto scm = diffusion::scm_loss(F, dir, d.s.flatten(), logvar, sd).loss * share;
  std::vector<Tensor> roots{scm * o_.scm_lambda}, grads{torch::ones_like(scm)};
  std::vector<Tensor> fake;
  if (o_.draws.largest_timestep) {
    fake = fake_features(m, d);
  } else {  // the prediction from the sCM's own forward, as upstream
    const auto pred = noised(predicted_x0(x_s, d.s, F, sd), d.s_d, d.z_d, sd);
    fake = model::trigflow_block_outputs(*teacher_, pred / sd, d.s_d.flatten(), m.cond, o_.head_blocks);
  }
  for (size_t h = 0; h < fake.size(); ++h) {
    roots.push_back(fake[h]);
    grads.push_back(feature_grads[h].to(fake[h].scalar_type()) * o_.adv_lambda);
  }
  if (before_backward_) before_backward_(last);
  torch::autograd::backward(roots, grads);
  return scm.detach().to(torch::kCPU, torch::kFloat64);
}

namespace {

void check_share(const SprintShare& share) {
  if (share.micro.empty()) {  // the batching keeps at least one sample on every rank (check_world_fits)
    throw std::logic_error(fmt::format("SANA-Sprint step {}: this rank's share is empty", share.step));
  }
}

}  // namespace

SprintLosses SprintObjective::generator(const SprintShare& share) {
  check_share(share);
  const double r = std::min(1.0, static_cast<double>(share.step) /
                                     static_cast<double>(std::max<int64_t>(1, o_.tangent_warmup_steps)));
  student_->train();
  heads_->eval();  // as upstream: no power iteration in the generator's phase
  std::vector<MicroDraws> draws;
  for (const auto& m : share.micro) draws.push_back(generator_draws(m, share.step));
  Tensor adv;
  const auto feature_grads = adversarial_gradients(share, draws, &adv);
  Tensor scm = torch::zeros({}, torch::kFloat64);
  int64_t row = 0;
  for (size_t i = 0; i < share.micro.size(); ++i) {
    const int64_t b = share.micro[i].x0.size(0);
    scm = scm + generator_backward(share.micro[i], draws[i], r, share.global_batch, rows_of(feature_grads, row, b),
                                   i + 1 == share.micro.size());
    row += b;
  }
  SprintLosses out;
  out.parts = torch::stack({o_.scm_lambda * scm + o_.adv_lambda * adv, scm, adv});
  return out;
}

SprintLosses SprintObjective::discriminator(const SprintShare& share) {
  check_share(share);
  const double sd = o_.sigma_data;
  const int64_t B = share.global_batch;
  const bool misaligned = o_.misaligned_pairs && B > 1;
  student_->eval();
  heads_->train();
  Features fake, shifted, real;
  int64_t place = share.first;
  Tensor previous = share.previous_x0;
  {
    torch::NoGradGuard no_grad;
    for (const auto& m : share.micro) {
      const int64_t b = m.x0.size(0);
      std::vector<double> cfg, s_g, s_fake, s_real, s_shift;
      std::vector<Tensor> z_g, z_fake, z_real, z_shift;
      for (const auto id : m.ids) {
        const auto d = diffusion::discriminator_draws({o_.seed, share.step, id}, o_.draws, m.x0.sizes().slice(1));
        cfg.push_back(d.cfg);
        s_g.push_back(d.s_g);
        s_fake.push_back(d.s_fake);
        s_real.push_back(d.s_real);
        s_shift.push_back(d.s_shift);
        z_g.push_back(d.z_g);
        z_fake.push_back(d.z_fake);
        z_real.push_back(d.z_real);
        z_shift.push_back(d.z_shift);
      }
      const auto sg = column(s_g, m.x0), sf = column(s_fake, m.x0), sr = column(s_real, m.x0);
      const auto x_s = noised(m.x0, sg, stacked(z_g, m.x0), sd);
      const auto F = model::trigflow_forward(*student_, x_s / sd, sg.flatten(), with_cfg(m.cond, cfg, m.x0));
      const auto f = noised(predicted_x0(x_s, sg, F, sd), sf, stacked(z_fake, m.x0), sd);
      fake.add(model::trigflow_block_outputs(*teacher_, f / sd, sf.flatten(), m.cond, o_.head_blocks), place);
      const auto rl = noised(m.x0, sr, stacked(z_real, m.x0), sd);
      real.add(model::trigflow_block_outputs(*teacher_, rl / sd, sr.flatten(), m.cond, o_.head_blocks), place);
      if (misaligned) {  // each sample's caption with the previous sample's latent (upstream's roll by one)
        const auto before = previous.defined() ? previous : share.micro.back().x0.narrow(0, share.micro.back().x0.size(0) - 1, 1);
        const auto rolled = torch::cat({before, m.x0.narrow(0, 0, b - 1)});
        const auto ss = column(s_shift, m.x0);
        const auto sh = noised(rolled, ss, stacked(z_shift, m.x0), sd);
        shifted.add(model::trigflow_block_outputs(*teacher_, sh / sd, ss.flatten(), m.cond, o_.head_blocks), B + place);
      }
      previous = m.x0.narrow(0, b - 1, 1);
      place += b;
    }
  }
  // The fake rows (and after them the misaligned ones) in one call, then the real ones: two
  // forwards of the heads, two power iterations, as upstream's two discriminator calls.
  if (misaligned) {
    for (size_t i = 0; i < shifted.parts.size(); ++i) fake.parts.push_back(shifted.parts[i]);
    fake.positions.insert(fake.positions.end(), shifted.positions.begin(), shifted.positions.end());
  }
  const int64_t fake_rows = misaligned ? 2 * B : B;
  std::optional<model::HeadReplicas> fake_params, real_params;  // exact mode: per micro-batch and call
  if (o_.exact) {
    fake_params.emplace(*heads_, fake.parts.size());
    real_params.emplace(*heads_, real.parts.size());
  }
  const auto gf = groups(fake, fake_rows, fake_params ? &*fake_params : nullptr);
  const auto gr = groups(real, B, real_params ? &*real_params : nullptr);
  const auto logits_fake = heads_->forward(fake.joined(false), &gf);
  const auto logits_real = heads_->forward(real.joined(false), &gr);
  const double T = static_cast<double>(logits_real.size(1));
  const auto loss_real = torch::relu(1 - logits_real).sum() / (static_cast<double>(B) * T);
  const auto loss_fake = torch::relu(1 + logits_fake).sum() / (static_cast<double>(fake_rows) * T);
  const auto loss = 0.5 * (loss_real + loss_fake);
  if (o_.exact) {
    loss.backward();  // into the replicas
    hand_over(*fake_params, false);
    hand_over(*real_params, true);
  } else {
    if (before_backward_) before_backward_(true);
    loss.backward();
  }
  SprintLosses out;
  out.parts = torch::stack({loss, loss_real, loss_fake}).detach().to(torch::kCPU, torch::kFloat64);
  return out;
}

}  // namespace sana::train
