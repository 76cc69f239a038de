#include "sana/diffusion/sampler.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "sana/diffusion/flow_matching.h"

namespace sana::diffusion {

std::vector<double> sigma_schedule(int steps, double flow_shift) {
  if (steps < 1) throw std::invalid_argument("a sampler needs at least one step");
  std::vector<double> sigmas;
  for (int i = 0; i <= steps; ++i) {
    sigmas.push_back(shift_sigma(1.0 - static_cast<double>(i) / steps, flow_shift));
  }
  return sigmas;
}

torch::Tensor sample_flow(const Velocity& velocity, const torch::Tensor& noise, int steps,
                          double flow_shift, const std::string& sampler) {
  const auto sigmas = sigma_schedule(steps, flow_shift);
  torch::Tensor x = noise;
  if (sampler == "flow_euler") {
    for (int i = 0; i < steps; ++i) {
      x = x + (sigmas[i + 1] - sigmas[i]) * velocity(x, sigmas[i]);
    }
    return x;
  }
  if (sampler != "flow_dpm-solver") {
    throw std::invalid_argument(fmt::format("unknown sampler '{}' (flow_euler, flow_dpm-solver)", sampler));
  }
  // DPM-Solver++(2M) with alpha = 1 - sigma: lambda = log(alpha / sigma); data prediction
  // x0 = x - sigma v. Second order from the second step on, first order on the last.
  auto lambda = [](double s) { return std::log((1.0 - s) / s); };
  torch::Tensor prev_x0;
  double prev_h = 0;
  for (int i = 0; i < steps; ++i) {
    const double s = sigmas[i], s_next = sigmas[i + 1];
    const auto x0 = x - s * velocity(x, s);
    if (s_next <= 0.0) {  // the last step lands on the data prediction
      x = x0;
      break;
    }
    // sigma = 1 has lambda = -inf: the first step is the DDIM step from pure noise.
    const double h = s >= 1.0 ? std::numeric_limits<double>::infinity() : lambda(s_next) - lambda(s);
    const double alpha_next = 1.0 - s_next;
    const double decay = std::isinf(h) ? 0.0 : std::exp(-h);  // e^{-h} = (sigma' alpha)/(sigma alpha')
    torch::Tensor d = x0;
    if (prev_x0.defined() && std::isfinite(h) && std::isfinite(prev_h)) {
      const double r = prev_h / h;
      d = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * prev_x0;
    }
    x = (s_next / s) * x - alpha_next * (decay - 1.0) * d;
    prev_x0 = x0;
    prev_h = h;
  }
  return x;
}

Velocity guided(const std::function<torch::Tensor(const torch::Tensor& x2, double sigma)>& both,
                double scale) {
  return [both, scale](const torch::Tensor& x, double sigma) {
    const auto v = both(torch::cat({x, x}), sigma).chunk(2);
    return v[1] + scale * (v[0] - v[1]);
  };
}

}  // namespace sana::diffusion
