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

#include <vector>

#include "sana/diffusion/flow_matching.h"

namespace sana::diffusion {

// How stage 2 draws its times and guidance scales (the scheduler.* and train.* keys of
// upstream's Sprint YAMLs).
struct SprintDrawOptions {
  double logit_mean = 0.2, logit_std = 1.6;        // the student's times: scheduler.logit_mean / logit_std
  double logit_mean_d = -0.6, logit_std_d = 1.0;   // the discriminator's: scheduler.*_discriminator
  std::vector<double> cfg_scales = {4.0, 4.5, 5.0};  // train.scm_cfg_scale: drawn uniformly per sample
  bool largest_timestep = true;                    // train.train_largest_timestep
  double largest = 1.5708, largest_prob = 0.5;     // train.largest_timestep, train.largest_timestep_prob
  bool diff_timesteps_d = true;                    // train.diff_timesteps_D: real and fake at other times
};

// Every random draw of one sample in one step of stage 2, a pure function of (train.seed,
// the step, the sample id): key = {seed, global step, id} (SampleKey's epoch field holds the
// step). Times are TrigFlow times; noises are N(0, 1) of the sample's shape (the caller
// scales them by sigma_d).
struct GeneratorDraws {
  double s = 0, cfg = 0;  // the sCM time and the guidance scale
  double s_x0 = 0;        // the time of the student's x0 prediction: s, or with train_largest_timestep
                          // a fresh time, the largest with probability largest_prob
  double s_d = 0;         // the time the prediction is re-noised at for the discriminator
  torch::Tensor z, z_x0, z_d;  // z_x0 undefined without train_largest_timestep (the sCM's x_s is used)
};
struct DiscriminatorDraws {
  double cfg = 0;
  double s_g = 0;  // the student's time: a fresh time, the largest with probability largest_prob
  double s_fake = 0, s_real = 0, s_shift = 0;
  torch::Tensor z_g, z_fake, z_real, z_shift;
};
GeneratorDraws generator_draws(const SampleKey& key, const SprintDrawOptions& o, at::IntArrayRef shape);
DiscriminatorDraws discriminator_draws(const SampleKey& key, const SprintDrawOptions& o, at::IntArrayRef shape);

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
