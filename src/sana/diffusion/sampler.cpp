#include "sana/diffusion/sampler.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "sana/diffusion/flow_matching.h"

namespace sana::diffusion {

namespace {

void check_sampler(const std::string& sampler) {
  if (sampler != "flow_euler" && sampler != "flow_dpm-solver") {
    throw std::invalid_argument(fmt::format("unknown sampler '{}' (flow_euler, flow_dpm-solver)", sampler));
  }
}

}  // namespace

std::vector<double> sigma_schedule(int steps, double flow_shift, const std::string& sampler) {
  if (steps < 1) throw std::invalid_argument("a sampler needs at least one step");
  check_sampler(sampler);
  std::vector<double> sigmas;
  if (sampler == "flow_euler") {
    const double last = shift_sigma(0.001, flow_shift);  // diffusers' sigma_min, already shifted
    for (int i = 0; i < steps; ++i) {
      const double t = steps == 1 ? 1.0 : 1.0 + (last - 1.0) * static_cast<double>(i) / (steps - 1);
      sigmas.push_back(shift_sigma(t, flow_shift));
    }
    sigmas.push_back(0.0);
    return sigmas;
  }
  for (int i = 0; i <= steps; ++i) {
    sigmas.push_back(shift_sigma(0.999 * static_cast<double>(steps - i) / steps, flow_shift));
  }
  return sigmas;
}

torch::Tensor sample_flow(const Velocity& velocity, const torch::Tensor& noise, int steps,
                          double flow_shift, const std::string& sampler) {
  const auto sigmas = sigma_schedule(steps, flow_shift, sampler);
  torch::Tensor x = noise;
  if (sampler == "flow_euler") {
    for (int i = 0; i < steps; ++i) {
      x = x + (sigmas[i + 1] - sigmas[i]) * velocity(x, sigmas[i]);
    }
    return x;
  }
  // DPM-Solver++(2M) with alpha = 1 - sigma: lambda = log(alpha / sigma); data prediction
  // x0 = x - sigma v. First order on the first step (no earlier prediction) and on the last
  // (it lands on sigma = 0: the data prediction), second order between.
  auto lambda = [](double s) { return std::log((1.0 - s) / s); };
  torch::Tensor prev_x0;
  double prev_h = 0;
  for (int i = 0; i < steps; ++i) {
    const double s = sigmas[i], s_next = sigmas[i + 1];
    const auto x0 = x - s * velocity(x, s);
    if (s_next <= 0.0) {
      x = x0;
      break;
    }
    const double h = lambda(s_next) - lambda(s);
    const double alpha_next = 1.0 - s_next;
    torch::Tensor d = x0;
    if (prev_x0.defined()) {  // D1 = (x0 - prev_x0) / r, r = prev_h / h; d = x0 + D1 / 2
      const double r = prev_h / h;
      d = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * prev_x0;
    }
    x = (s_next / s) * x - alpha_next * std::expm1(-h) * d;
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

std::vector<double> scm_times(int steps, double max, double mid) {
  if (steps < 1) throw std::invalid_argument("a sampler needs at least one step");
  if (steps == 2 && mid > 0) return {max, mid, 0.0};
  std::vector<double> times;
  // torch.linspace in float32, as upstream's (its times are float32 tensors).
  const auto t = torch::linspace(max, 0, steps + 1, torch::kFloat32);
  for (int i = 0; i <= steps; ++i) times.push_back(t[i].item<float>());
  return times;
}

torch::Tensor sample_scm(const TrigflowOutput& model, const torch::Tensor& noise,
                         const std::vector<torch::Tensor>& step_noise, const std::vector<double>& times,
                         double sigma_d) {
  if (times.size() < 2 || step_noise.size() + 1 < times.size()) {
    throw std::invalid_argument("sample_scm: one fresh noise per step and at least two times");
  }
  auto x = noise * sigma_d;
  torch::Tensor x0;
  for (size_t i = 0; i + 1 < times.size(); ++i) {
    const double s = times[i], t = times[i + 1];
    const auto F = model(x / sigma_d, s) * sigma_d;
    x0 = std::cos(s) * x - std::sin(s) * F;
    x = std::cos(t) * x0 + std::sin(t) * sigma_d * step_noise[i].to(x.device(), x.scalar_type());
  }
  return x0 / sigma_d;
}

}  // namespace sana::diffusion
