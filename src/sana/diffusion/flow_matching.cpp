#include "sana/diffusion/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
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

double sample_sigma(const SampleKey& key, const TimestepOptions& sched) {
  util::RandomStream rng(key_of(key, "sigma"));
  if (sched.weighting == Weighting::logit_normal) {
    return 1.0 / (1.0 + std::exp(-(sched.logit_mean + sched.logit_std * normal(rng))));
  }
  const double u = rng.uniform();
  if (sched.weighting == Weighting::sd3_mode) {
    const double c = std::cos(M_PI * u / 2.0);
    return 1.0 - u - sched.mode_scale * (c * c - 1.0 + u);
  }
  return u;
}

double shift_sigma(double sigma, double flow_shift) {
  return flow_shift * sigma / (1.0 + (flow_shift - 1.0) * sigma);
}

double grid_sigma(int64_t t, int64_t steps, double flow_shift) {
  // numpy.linspace(start, stop, num): y = i * ((stop - start) / (num - 1)) + start, the last
  // element set to stop. With start 1 and stop 1/steps, 1 - y is t / steps up to rounding.
  const double start = 1.0, stop = 1.0 / static_cast<double>(steps);
  double beta = stop;
  if (t < steps - 1) {
    const double step = (stop - start) / static_cast<double>(steps - 1);
    volatile double product = static_cast<double>(t) * step;  // no fused multiply-add: numpy rounds twice
    beta = product + start;
  }
  const double sigma = 1.0 - beta;
  return flow_shift * sigma / (1.0 + (flow_shift - 1.0) * sigma);
}

int64_t grid_index(double u, int64_t steps) {
  return std::clamp<int64_t>(static_cast<int64_t>(std::floor(u * static_cast<double>(steps))), 0, steps - 1);
}

bool caption_dropped(const SampleKey& key, double probability) {
  util::RandomStream rng(key_of(key, "caption_dropout"));
  return rng.uniform() < probability;
}

namespace {

// The rows of a flow batch: each row's noise, sigma and whether its condition is dropped.
struct FlowRows {
  std::vector<torch::Tensor> noise;
  std::vector<double> sigmas, alphas, timesteps;
  std::vector<uint8_t> dropped;
  void add(torch::Tensor eps, double sigma, bool grid, bool drop) {
    noise.push_back(std::move(eps));
    sigmas.push_back(sigma);
    alphas.push_back(1.0 - sigma);  // in float64 before the cast, as upstream's alphas table
    timesteps.push_back(grid ? std::trunc(sigma * 1000.0) : sigma * 1000.0);
    dropped.push_back(drop ? 1 : 0);
  }
  FlowBatch assemble(const torch::Tensor& x0) const;
};

}  // namespace

FlowBatch make_flow_batch(const torch::Tensor& x0, const std::vector<uint32_t>& ids,
                          uint64_t seed, int64_t epoch, const TimestepOptions& sched,
                          double drop_probability) {
  TORCH_CHECK(x0.size(0) == static_cast<int64_t>(ids.size()), "one id per sample");
  FlowRows rows;
  const auto shape = x0.sizes().slice(1);
  const bool grid = sched.integer_grid;
  for (uint32_t id : ids) {
    const SampleKey key{seed, epoch, id};
    const double u = sample_sigma(key, sched);
    const double sigma = grid ? grid_sigma(grid_index(u, sched.train_sampling_steps), sched.train_sampling_steps,
                                           sched.flow_shift)
                              : shift_sigma(u, sched.flow_shift);
    rows.add(sample_noise(key, shape), sigma, grid, caption_dropped(key, drop_probability));
  }
  return rows.assemble(x0);
}

FlowBatch make_eval_batch(const torch::Tensor& x0, uint32_t id, uint64_t seed, const std::vector<int64_t>& timesteps,
                          const TimestepOptions& sched) {
  TORCH_CHECK(x0.size(0) == static_cast<int64_t>(timesteps.size()), "one row per timestep");
  FlowRows rows;
  const auto shape = x0.sizes().slice(1);
  const bool grid = sched.integer_grid;
  const int64_t steps = sched.train_sampling_steps;
  for (int64_t t : timesteps) {
    const double sigma = grid ? grid_sigma(t, steps, sched.flow_shift)
                              : shift_sigma(static_cast<double>(t) / static_cast<double>(steps), sched.flow_shift);
    const auto eps = torch::randn(shape, sample_generator({seed, t, id}, "eval_noise"), torch::kFloat32);
    rows.add(eps, sigma, grid, false);
  }
  return rows.assemble(x0);
}

namespace {

// A tensor made on the host, on `like`'s device in its dtype, without making the host wait:
// converted on the host, then through page-locked memory as a non-blocking copy on the
// current stream (the caching host allocator keeps the pinned buffer until the copy is
// done). On the CPU the conversion alone, as before.
torch::Tensor to_device_of(const torch::Tensor& host, const torch::Tensor& like, torch::ScalarType dtype) {
  const auto converted = host.to(dtype);
  if (!like.is_cuda()) return converted.to(like.device());
  return converted.pin_memory().to(like.device(), /*non_blocking=*/true);
}

}  // namespace

FlowBatch FlowRows::assemble(const torch::Tensor& x0) const {
  FlowBatch b;
  const auto dtype = x0.scalar_type();
  const auto eps = to_device_of(torch::stack(noise), x0, dtype);
  b.sigmas = to_device_of(torch::tensor(sigmas, torch::kFloat64), x0, dtype);
  std::vector<int64_t> view(static_cast<size_t>(x0.dim()), 1);
  view[0] = x0.size(0);
  const auto s = b.sigmas.view(view);
  const auto a = to_device_of(torch::tensor(alphas, torch::kFloat64), x0, dtype).view(view);
  b.noisy = a * x0 + s * eps;
  b.target = eps - x0;
  b.timesteps = to_device_of(torch::tensor(timesteps, torch::kFloat64), x0, dtype);
  b.dropped = to_device_of(torch::tensor(std::vector<int64_t>(dropped.begin(), dropped.end()), torch::kInt64), x0,
                           torch::kBool);
  return b;
}

torch::Tensor flow_loss(const torch::Tensor& prediction, const torch::Tensor& target) {
  return torch::mse_loss(prediction.to(torch::kFloat32), target.to(torch::kFloat32));
}

torch::Tensor cell_weights(const torch::Tensor& masks, int64_t h, int64_t w, double unmasked_weight) {
  const auto m = masks.to(torch::kFloat32);
  const auto cells = m.size(2) == h && m.size(3) == w ? m : torch::adaptive_avg_pool2d(m, {h, w});
  return cells.clamp(unmasked_weight, 1.0);
}

torch::Tensor masked_flow_loss(const torch::Tensor& prediction, const torch::Tensor& target,
                               const torch::Tensor& weights) {
  const auto scale = weights.sqrt();
  return torch::mse_loss(prediction.to(torch::kFloat32) * scale, target.to(torch::kFloat32) * scale);
}

}  // namespace sana::diffusion
