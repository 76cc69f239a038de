// Samplers for the flow-matching ODE dx/dsigma = v(x, sigma), from pure noise at sigma = 1
// to data at sigma = 0, on upstream's shifted schedule: flow Euler, and DPM-Solver++(2M)
// in the flow parameterisation (alpha = 1 - sigma; data prediction x - sigma v), which
// reaches the same images in fewer steps. No randomness inside: the caller's noise fixes
// the result.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace sana::diffusion {

// The model's velocity (eps - x0) at x for noise level sigma (the model sees sigma * 1000).
using Velocity = std::function<torch::Tensor(const torch::Tensor& x, double sigma)>;

// steps + 1 noise levels from 1 to 0: sigma_i = shift(1 - i / steps).
std::vector<double> sigma_schedule(int steps, double flow_shift);

// "flow_euler" or "flow_dpm-solver" (upstream's vis_sampler names). Throws
// std::invalid_argument for other names.
torch::Tensor sample_flow(const Velocity& velocity, const torch::Tensor& noise, int steps,
                          double flow_shift, const std::string& sampler);

// Classifier-free guidance: one batched model call on [cond; uncond] halves,
// v = v_u + scale (v_c - v_u). `both` evaluates the doubled batch.
Velocity guided(const std::function<torch::Tensor(const torch::Tensor& x2, double sigma)>& both,
                double scale);

}  // namespace sana::diffusion
