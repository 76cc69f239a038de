#include "sana/diffusion/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "sana/util/random.h"

namespace sana::diffusion {

namespace {

uint64_t key_of(const SampleKey& key, std::string_view purpose) {
  return util::stream_key(purpose, {key.seed, static_cast<uint64_t>(key.epoch), key.sample});
}

// A standard normal from a counter-based stream (Box-Muller): identical everywhere.
double normal(util::RandomStream& rng) {
  double u1 = rng.uniform();
  while (u1 <= 0.0) u1 = rng.uniform();
  const double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

at::Generator sample_generator(const SampleKey& key, std::string_view purpose) {
  return at::detail::createCPUGenerator(key_of(key, purpose));
}

torch::Tensor sample_noise(const SampleKey& key, at::IntArrayRef shape) {
  return torch::randn(shape, sample_generator(key, "noise"), torch::kFloat32);
}

double sample_sigma(const SampleKey& key, const config::SchedulerConfig& sched) {
  util::RandomStream rng(key_of(key, "sigma"));
  if (sched.weighting_scheme == config::Weighting::logit_normal) {
    return 1.0 / (1.0 + std::exp(-(sched.logit_mean + sched.logit_std * normal(rng))));
  }
  const double u = rng.uniform();
  if (sched.weighting_scheme == config::Weighting::mode) {
    const double c = std::cos(M_PI * u / 2.0);
    return 1.0 - u - sched.mode_scale * (c * c - 1.0 + u);
  }
  return u;
}

double shift_sigma(double sigma, double flow_shift) {
  return flow_shift * sigma / (1.0 + (flow_shift - 1.0) * sigma);
}

bool caption_dropped(const SampleKey& key, double probability) {
  util::RandomStream rng(key_of(key, "caption_dropout"));
  return rng.uniform() < probability;
}

FlowBatch make_flow_batch(const torch::Tensor& x0, const std::vector<uint32_t>& ids,
                          uint64_t seed, int64_t epoch, const config::SchedulerConfig& sched,
                          double drop_probability) {
  TORCH_CHECK(x0.size(0) == static_cast<int64_t>(ids.size()), "one id per sample");
  std::vector<torch::Tensor> noise;
  std::vector<double> sigmas;
  std::vector<uint8_t> dropped;
  const auto shape = x0.sizes().slice(1);
  for (uint32_t id : ids) {
    const SampleKey key{seed, epoch, id};
    noise.push_back(sample_noise(key, shape));
    sigmas.push_back(shift_sigma(sample_sigma(key, sched), sched.flow_shift));
    dropped.push_back(caption_dropped(key, drop_probability) ? 1 : 0);
  }
  FlowBatch b;
  const auto eps = torch::stack(noise).to(x0.device(), x0.scalar_type());
  b.sigmas = torch::tensor(sigmas, torch::kFloat64).to(x0.device(), x0.scalar_type());
  std::vector<int64_t> view(static_cast<size_t>(x0.dim()), 1);
  view[0] = x0.size(0);
  const auto s = b.sigmas.view(view);
  b.noisy = (1 - s) * x0 + s * eps;
  b.target = eps - x0;
  b.timesteps = b.sigmas * 1000.0;
  b.dropped = torch::tensor(std::vector<int64_t>(dropped.begin(), dropped.end()), torch::kInt64)
                  .to(torch::kBool)
                  .to(x0.device());
  return b;
}

torch::Tensor flow_loss(const torch::Tensor& prediction, const torch::Tensor& target) {
  return torch::mse_loss(prediction.to(torch::kFloat32), target.to(torch::kFloat32));
}

}  // namespace sana::diffusion
