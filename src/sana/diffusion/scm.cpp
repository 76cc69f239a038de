#include "sana/diffusion/scm.h"

#include <cmath>

namespace sana::diffusion {

namespace {

torch::Tensor per_sample(const torch::Tensor& v) { return v.reshape({-1, 1, 1, 1}); }

}  // namespace

torch::Tensor trigflow_time(const torch::Tensor& normal, double logit_mean, double logit_std) {
  return torch::atan(torch::exp(normal * logit_std + logit_mean) / 0.5);
}

namespace {

// One sample's draws of one purpose: a TrigFlow time, a uniform, a choice, a noise.
struct Draw {
  const SampleKey& key;
  double time(const char* purpose, double mean, double std) const {
    const double n = torch::randn({1}, sample_generator(key, purpose), torch::kFloat64).item<double>();
    return std::atan(std::exp(n * std + mean) / 0.5);
  }
  double uniform(const char* purpose) const {
    return torch::rand({1}, sample_generator(key, purpose), torch::kFloat64).item<double>();
  }
  double choice(const char* purpose, const std::vector<double>& values) const {
    TORCH_CHECK(!values.empty(), "train.scm_cfg_scale is empty");
    const auto i = torch::randint(static_cast<int64_t>(values.size()), {1}, sample_generator(key, purpose),
                                  torch::kInt64).item<int64_t>();
    return values[static_cast<size_t>(i)];
  }
  torch::Tensor noise(const char* purpose, at::IntArrayRef shape) const {
    return torch::randn(shape, sample_generator(key, purpose), torch::kFloat32);
  }
};

}  // namespace

GeneratorDraws generator_draws(const SampleKey& key, const SprintDrawOptions& o, at::IntArrayRef shape) {
  const Draw d{key};
  GeneratorDraws g;
  g.s = d.time("sprint.s", o.logit_mean, o.logit_std);
  g.z = d.noise("sprint.z", shape);
  g.cfg = d.choice("sprint.cfg", o.cfg_scales);
  g.s_x0 = g.s;
  if (o.largest_timestep) {
    g.s_x0 = d.uniform("sprint.largest") < o.largest_prob ? o.largest
                                                           : d.time("sprint.s_x0", o.logit_mean, o.logit_std);
    g.z_x0 = d.noise("sprint.z_x0", shape);
  }
  g.s_d = d.time("sprint.s_d", o.logit_mean_d, o.logit_std_d);
  g.z_d = d.noise("sprint.z_d", shape);
  return g;
}

DiscriminatorDraws discriminator_draws(const SampleKey& key, const SprintDrawOptions& o, at::IntArrayRef shape) {
  const Draw d{key};
  DiscriminatorDraws r;
  r.cfg = d.choice("sprint.cfg", o.cfg_scales);
  r.s_g = d.time("sprint.s", o.logit_mean, o.logit_std);
  if (o.largest_timestep && d.uniform("sprint.largest") < o.largest_prob) r.s_g = o.largest;
  r.z_g = d.noise("sprint.z", shape);
  r.s_fake = d.time("sprint.s_fake", o.logit_mean_d, o.logit_std_d);
  r.s_real = o.diff_timesteps_d ? d.time("sprint.s_real", o.logit_mean_d, o.logit_std_d) : r.s_fake;
  r.s_shift = d.time("sprint.s_shift", o.logit_mean_d, o.logit_std_d);
  r.z_fake = d.noise("sprint.z_fake", shape);
  r.z_real = d.noise("sprint.z_real", shape);
  r.z_shift = d.noise("sprint.z_shift", shape);
  return r;
}

torch::Tensor scm_direction(const torch::Tensor& F_minus, const torch::Tensor& dF, const torch::Tensor& dxds,
                            const torch::Tensor& x_s, const torch::Tensor& s, double r, double sigma_d) {
  torch::NoGradGuard no_grad;
  const auto t = per_sample(s).to(F_minus.scalar_type());
  const auto cos = torch::cos(t), sin = torch::sin(t);
  auto g = -cos * cos * (sigma_d * F_minus - dxds) - r * (cos * sin * x_s + sigma_d * dF);
  const auto norm = g.flatten(1).norm(2, 1).reshape({-1, 1, 1, 1});
  return g / (norm + 0.1);
}

ScmLoss scm_loss(const torch::Tensor& F_theta, const torch::Tensor& g, const torch::Tensor& s,
                 const torch::Tensor& logvar, double sigma_d) {
  const auto t = per_sample(s).to(F_theta.scalar_type());
  const auto weight = 1 / (torch::tan(t) * sigma_d);
  const auto l2 = torch::square(F_theta - F_theta.detach() - g);
  ScmLoss out;
  if (logvar.defined()) {
    const auto lv = per_sample(logvar).to(F_theta.scalar_type());
    out.loss = (weight / torch::exp(lv) * l2 + lv).mean();
  } else {
    out.loss = (weight * l2).mean();
  }
  out.without_logvar = (weight * l2).mean().detach();
  return out;
}

}  // namespace sana::diffusion
