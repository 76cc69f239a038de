// SANA-Sprint's continuous-time consistency objective (sCM, in TrigFlow; upstream's
// train_scripts/train_scm_ladd.py; docs/upstream.md, "SANA-Sprint"). With sigma_d the data scale, x0 the
// latent times sigma_d, z ~ N(0, sigma_d^2) and a TrigFlow time s in (0, pi/2]:
//   x_s = cos s x0 + sin s z,
// the frozen teacher's velocity dx/ds = sigma_d F_teacher(x_s / sigma_d, s) (with guidance),
// and the student's F_theta with its exact derivative dF along
// (cos s sin s dx/ds / sigma_d, cos s sin s) (model/trigflow.h's trigflow_jvp):
//   g = -cos^2 s (sigma_d F- - dx/ds) - r (cos s sin s x_s + sigma_d dF),  F- = F_theta detached,
//   g <- g / (||g|| + 0.1) per sample,  weight = 1 / (sigma_d tan s),
//   loss = mean(weight / exp(logvar) (F_theta - F- - g)^2 + logvar),
// r = min(1, step / train.tangent_warmup_steps).
#pragma once

#include <torch/torch.h>

namespace sana::diffusion {

// A TrigFlow time from a standard normal draw n (upstream's logit_normal_trigflow
// density): s = atan(exp(mean + std n) / 0.5) (0.5 is upstream's constant, not sigma_d).
torch::Tensor trigflow_time(const torch::Tensor& normal, double logit_mean, double logit_std);

// The normalised target direction g of every sample (no gradient), [B, C, H, W].
// F_minus, dF, dxds, x_s: [B, C, H, W]; s: [B].
torch::Tensor scm_direction(const torch::Tensor& F_minus, const torch::Tensor& dF, const torch::Tensor& dxds,
                            const torch::Tensor& x_s, const torch::Tensor& s, double r, double sigma_d);

struct ScmLoss {
  torch::Tensor loss;       // the objective, a scalar with the graph of F_theta and logvar
  torch::Tensor without_logvar;  // mean(weight (F_theta - F- - g)^2) detached, upstream's loss_no_logvar
};

// F_theta: the student's output with its graph; g from scm_direction; logvar [B, 1] (the
// student's log-variance; undefined: 0, no adaptive weight).
ScmLoss scm_loss(const torch::Tensor& F_theta, const torch::Tensor& g, const torch::Tensor& s,
                 const torch::Tensor& logvar, double sigma_d);

}  // namespace sana::diffusion
