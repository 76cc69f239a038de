#include "sana/diffusion/scm.h"

namespace sana::diffusion {

namespace {

torch::Tensor per_sample(const torch::Tensor& v) { return v.reshape({-1, 1, 1, 1}); }

}  // namespace

torch::Tensor trigflow_time(const torch::Tensor& normal, double logit_mean, double logit_std) {
  return torch::atan(torch::exp(normal * logit_std + logit_mean) / 0.5);
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
