// Samplers for the flow-matching ODE dx/dsigma = v(x, sigma), from noise to data at
// sigma = 0, on upstream's grids: flow Euler as diffusers' FlowMatchEulerDiscreteScheduler
// steps, and DPM-Solver++(2M) in the flow parameterisation (alpha = 1 - sigma; data
// prediction x - sigma v) as upstream's DPMS(schedule FLOW, time_uniform_flow, multistep,
// order 2, lower_order_final): first order on the first and last steps, second order
// between. No randomness inside: the caller's noise fixes the result.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace sana::diffusion {

// The model's velocity (eps - x0) at x for noise level sigma (the model sees sigma * 1000).
using Velocity = std::function<torch::Tensor(const torch::Tensor& x, double sigma)>;

// The steps + 1 noise levels a sampler visits, ending at 0.
//   flow_euler (diffusers): shift(linspace(1, shift(0.001), steps)), then 0 (the last nonzero
//     level is shifted twice, as diffusers does).
//   flow_dpm-solver (upstream's time_uniform_flow): shift(linspace(0.999, 0, steps + 1)); it
//     starts at shift(0.999), not 1.
std::vector<double> sigma_schedule(int steps, double flow_shift, const std::string& sampler);

// "flow_euler" or "flow_dpm-solver" (upstream's vis_sampler names). Throws
// std::invalid_argument for other names.
torch::Tensor sample_flow(const Velocity& velocity, const torch::Tensor& noise, int steps,
                          double flow_shift, const std::string& sampler);

// Classifier-free guidance: one batched model call on [cond; uncond] halves,
// v = v_u + scale (v_c - v_u). `both` evaluates the doubled batch.
Velocity guided(const std::function<torch::Tensor(const torch::Tensor& x2, double sigma)>& both,
                double scale);

// SANA-Sprint's few-step sampler (upstream's SCMScheduler with scripts/inference_sana_sprint.py's
// loop). The TrigFlow times it visits: linspace(max, 0, steps + 1), or with 2 steps and an
// intermediate time `mid` > 0, [max, mid, 0] (upstream's pipeline: 1.3; its training
// previews: 1.0).
std::vector<double> scm_times(int steps, double max = 1.5708, double mid = 0);

// The student's TrigFlow output F at x_hat = x / sigma_d and TrigFlow time s (the guidance
// goes in through its embedding).
using TrigflowOutput = std::function<torch::Tensor(const torch::Tensor& x_hat, double s)>;

// From x = sigma_d noise at times[0]: each step x0 = cos s x - sin s sigma_d F(x / sigma_d, s),
// then x = cos t x0 + sin t sigma_d z with fresh noise z = step_noise[i] (N(0, 1), one per
// step). Returns the last x0 / sigma_d: the latent the VAE decodes. No randomness inside.
torch::Tensor sample_scm(const TrigflowOutput& model, const torch::Tensor& noise,
                         const std::vector<torch::Tensor>& step_noise, const std::vector<double>& times,
                         double sigma_d);

}  // namespace sana::diffusion
