// The objective's random draws are pure functions of (seed, epoch, sample, purpose):
// bitwise the same in any thread, order or batch grouping; and the objective's formulas.
#include "catch.h"
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "sana/util/safetensors.h"
#include "sana/diffusion/flow_matching.h"
#include "test_support.h"

using namespace sana::diffusion;

TEST_CASE("per-sample draws are the same in any thread and order", "[diffusion][streams]") {
  TimestepOptions sched;
  const int n = 64;
  std::vector<torch::Tensor> serial(n);
  std::vector<double> sigma(n);
  for (int i = n - 1; i >= 0; --i) {  // backwards on purpose
    serial[static_cast<size_t>(i)] = sample_noise({7, 3, static_cast<uint64_t>(i)}, {3, 4, 5});
    sigma[static_cast<size_t>(i)] = sample_sigma({7, 3, static_cast<uint64_t>(i)}, sched);
  }
  std::vector<torch::Tensor> threaded(n);
  std::vector<double> threaded_sigma(n);
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      for (int i = t; i < n; i += 4) {
        threaded[static_cast<size_t>(i)] = sample_noise({7, 3, static_cast<uint64_t>(i)}, {3, 4, 5});
        threaded_sigma[static_cast<size_t>(i)] = sample_sigma({7, 3, static_cast<uint64_t>(i)}, sched);
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int i = 0; i < n; ++i) {
    CHECK(torch::equal(serial[static_cast<size_t>(i)], threaded[static_cast<size_t>(i)]));
    CHECK(sigma[static_cast<size_t>(i)] == threaded_sigma[static_cast<size_t>(i)]);
  }
  // Different samples, epochs or seeds draw differently.
  CHECK_FALSE(torch::equal(serial[0], serial[1]));
  CHECK_FALSE(torch::equal(serial[0], sample_noise({7, 4, 0}, {3, 4, 5})));
  CHECK_FALSE(torch::equal(serial[0], sample_noise({8, 3, 0}, {3, 4, 5})));
}

namespace {

// The draws of samples 0..15 (epoch 2, seed 5): noise, sigma, dropout, in one file.
sana::NamedTensors draws_of_samples() {
  TimestepOptions sched;
  std::vector<torch::Tensor> noise;
  std::vector<double> sigma, dropped;
  for (uint64_t id = 0; id < 16; ++id) {
    noise.push_back(sample_noise({5, 2, id}, {3, 8, 8}));
    sigma.push_back(sample_sigma({5, 2, id}, sched));
    dropped.push_back(caption_dropped({5, 2, id}, 0.5) ? 1.0 : 0.0);
  }
  return {{"noise", torch::stack(noise)},
          {"sigma", torch::tensor(sigma, torch::kFloat64)},
          {"dropped", torch::tensor(dropped, torch::kFloat64)}};
}

}  // namespace

// Run by the next test in a separate process (hidden from the default run).
TEST_CASE("write per-sample draws for another process", "[.stream_child]") {
  const char* out = std::getenv("SANA_STREAM_OUT");
  REQUIRE(out != nullptr);
  sana::write_safetensors(out, draws_of_samples());
}

TEST_CASE("per-sample draws are the same in another process", "[diffusion][streams]") {
  sana::test::TempDir dir;
  const std::string file = dir.path("child.safetensors");
  // A fresh process with other thread settings, asked in another order (it draws 0..15,
  // this one 15..0 first).
  std::vector<torch::Tensor> backwards;
  for (uint64_t id = 16; id-- > 0;) backwards.push_back(sample_noise({5, 2, id}, {3, 8, 8}));
  const auto r = sana::test::run_command("OMP_NUM_THREADS=1 SANA_STREAM_OUT=" + file +
                                         " /proc/" + std::to_string(getpid()) + "/exe '[stream_child]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto theirs = sana::read_safetensors(file);
  for (const auto& [name, ours] : draws_of_samples()) {
    INFO(name);
    CHECK(torch::equal(ours, theirs.get(name)));
  }
  CHECK(torch::equal(torch::stack(backwards).flip(0), theirs.get("noise")));
}

TEST_CASE("a sample's noisy input does not depend on how the batch is split", "[diffusion][streams]") {
  TimestepOptions sched;
  sched.flow_shift = 3.0;
  const auto x0 = torch::rand({4, 3, 8, 8});
  const auto whole = make_flow_batch(x0, {10, 11, 12, 13}, 5, 2, sched);
  const auto half = make_flow_batch(x0.slice(0, 2, 4), {12, 13}, 5, 2, sched);  // another rank
  CHECK(torch::equal(whole.noisy.slice(0, 2, 4), half.noisy));
  CHECK(torch::equal(whole.target.slice(0, 2, 4), half.target));
  // Caption dropout too: the same samples are dropped whichever batch they are in, and
  // about the configured fraction of many samples.
  std::vector<uint32_t> many(2000);
  for (uint32_t i = 0; i < many.size(); ++i) many[i] = i;
  const auto all = make_flow_batch(torch::zeros({2000, 1}), many, 5, 2, sched, 0.1);
  const auto part = make_flow_batch(torch::zeros({2, 1}), {1500, 7}, 5, 2, sched, 0.1);
  CHECK(part.dropped[0].item<bool>() == all.dropped[1500].item<bool>());
  CHECK(part.dropped[1].item<bool>() == all.dropped[7].item<bool>());
  const double fraction = all.dropped.to(torch::kFloat64).mean().item<double>();
  CHECK(fraction > 0.08);
  CHECK(fraction < 0.12);
  CHECK_FALSE(whole.dropped.any().item<bool>());  // probability 0 drops nothing
}

TEST_CASE("flow-matching formulas", "[diffusion]") {
  TimestepOptions sched;
  sched.flow_shift = 3.0;
  sched.integer_grid = false;
  CHECK(shift_sigma(0.5, 3.0) == Approx(0.75));
  CHECK(shift_sigma(0.25, 1.0) == 0.25);
  const auto x0 = torch::rand({2, 3, 4, 4});
  const auto b = make_flow_batch(x0, {0, 1}, 1, 0, sched);
  for (int i = 0; i < 2; ++i) {
    const double s = shift_sigma(sample_sigma({1, 0, static_cast<uint64_t>(i)}, sched), 3.0);
    const auto eps = sample_noise({1, 0, static_cast<uint64_t>(i)}, {3, 4, 4});
    CHECK(b.sigmas[i].item<double>() == Approx(s));
    CHECK(b.timesteps[i].item<double>() == Approx(1000 * s));
    CHECK(torch::allclose(b.noisy[i], (1 - s) * x0[i] + s * eps, 1e-5, 1e-6));
    CHECK(torch::allclose(b.target[i], eps - x0[i]));
  }
  CHECK(flow_loss(b.target, b.target).item<float>() == 0.0f);
  // Upstream's integer grid: t = floor(1000 u), sigma from the shifted table, integer timesteps.
  sched.integer_grid = true;
  const auto g = make_flow_batch(x0, {0, 1}, 1, 0, sched);
  for (int i = 0; i < 2; ++i) {
    const int64_t t = grid_index(sample_sigma({1, 0, static_cast<uint64_t>(i)}, sched), 1000);
    const double s = grid_sigma(t, 1000, 3.0);
    CHECK(g.sigmas[i].item<double>() == Approx(s));
    CHECK(g.timesteps[i].item<double>() == std::trunc(1000 * s));
    CHECK(g.timesteps[i].item<double>() != b.timesteps[i].item<double>());
  }
  CHECK(grid_sigma(0, 1000, 3.0) == 0.0);
  CHECK(grid_sigma(500, 1000, 3.0) == Approx(0.75));
  CHECK(grid_sigma(999, 1000, 1.0) == Approx(0.999));
  CHECK(grid_index(0.99999999, 1000) == 999);
  // Logit-normal(0, 1) has median 0.5; uniform stays in [0, 1); dropout hits its rate.
  std::vector<double> draws;
  int dropped = 0;
  TimestepOptions uniform;
  uniform.weighting = Weighting::uniform;
  for (uint64_t i = 0; i < 4000; ++i) {
    draws.push_back(sample_sigma({2, 0, i}, sched));
    const double u = sample_sigma({2, 0, i}, uniform);
    CHECK((u >= 0.0 && u < 1.0));
    dropped += caption_dropped({2, 0, i}, 0.1) ? 1 : 0;
  }
  std::nth_element(draws.begin(), draws.begin() + 2000, draws.end());
  CHECK(draws[2000] == Approx(0.5).margin(0.03));
  CHECK(dropped == Approx(400).margin(60));
  // Logit-normal(1, 0.5): the quartiles are sigmoid(1 - 0.6745 x 0.5), sigmoid(1),
  // sigmoid(1 + 0.6745 x 0.5) (0.6599, 0.7311, 0.7920; 4000 draws: about 0.0025 of noise),
  // so the mean, the spread and the sign of the logit each show.
  TimestepOptions shifted;
  shifted.weighting = Weighting::logit_normal;
  shifted.logit_mean = 1.0;
  shifted.logit_std = 0.5;
  std::vector<double> logit;
  for (uint64_t i = 0; i < 4000; ++i) logit.push_back(sample_sigma({3, 0, i}, shifted));
  std::sort(logit.begin(), logit.end());
  const auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  CHECK(logit[1000] == Approx(sigmoid(1.0 - 0.6745 * 0.5)).margin(0.01));
  CHECK(logit[2000] == Approx(sigmoid(1.0)).margin(0.01));
  CHECK(logit[3000] == Approx(sigmoid(1.0 + 0.6745 * 0.5)).margin(0.01));
  // sd3's mode weighting, as diffusers' compute_density_for_timestep_sampling writes it:
  // 1 - u - mode_scale (cos^2(pi u / 2) - 1 + u), u the uniform draw of the same sample.
  TimestepOptions mode;
  mode.weighting = Weighting::sd3_mode;
  mode.mode_scale = 1.29;
  for (uint64_t i = 0; i < 50; ++i) {
    const double u = sample_sigma({4, 0, i}, uniform);
    const double c = std::cos(3.141592653589793 * u / 2.0);
    CHECK(sample_sigma({4, 0, i}, mode) == Approx(1.0 - u - 1.29 * (c * c - 1.0 + u)).epsilon(1e-12));
  }
}

TEST_CASE("masked loss: cell weights average the mask, white masks change nothing", "[diffusion][mask]") {
  // A 4x4 mask over a 2x2 grid: the left column of cells white, the right half-covered.
  auto mask = torch::zeros({1, 1, 4, 4});
  mask.index_put_({0, 0, torch::indexing::Slice(), torch::indexing::Slice(0, 2)}, 1.0);
  mask.index_put_({0, 0, torch::indexing::Slice(0, 2), 2}, 1.0);
  mask.index_put_({0, 0, torch::indexing::Slice(2, 4), 3}, 1.0);
  const auto w = cell_weights(mask, 2, 2, 0.1);
  CHECK(w[0][0][0][0].item<float>() == 1.0f);
  CHECK(w[0][0][1][0].item<float>() == 1.0f);
  CHECK(w[0][0][0][1].item<float>() == 0.5f);  // 2 of its 4 pixels
  CHECK(w[0][0][1][1].item<float>() == 0.5f);
  CHECK(cell_weights(torch::zeros({1, 1, 4, 4}), 2, 2, 0.1).min().item<float>() == Approx(0.1));

  // The loss: mean over cells and channels of weight x squared error (OneTrainer's formula).
  torch::manual_seed(5);
  const auto pred = torch::randn({2, 3, 2, 2}, torch::requires_grad());
  const auto target = torch::randn({2, 3, 2, 2});
  const auto weights = torch::rand({2, 1, 2, 2}) * 0.9 + 0.1;
  const auto expected = (weights.to(torch::kFloat64) * (pred - target).to(torch::kFloat64).pow(2)).mean();
  CHECK(masked_flow_loss(pred, target, weights).item<double>() == Approx(expected.item<double>()).epsilon(1e-6));

  // All-ones weights: flow_loss's value and gradient, bitwise.
  auto a = pred.detach().clone().requires_grad_(true);
  auto b = pred.detach().clone().requires_grad_(true);
  const auto plain = flow_loss(a, target);
  const auto masked = masked_flow_loss(b, target, cell_weights(torch::ones({2, 1, 4, 4}), 2, 2, 0.1));
  CHECK(plain.item<float>() == masked.item<float>());
  plain.backward();
  masked.backward();
  CHECK(torch::equal(a.grad(), b.grad()));
}

TEST_CASE("held-out batches: the sample at each timestep, the same noise every time", "[diffusion][eval]") {
  TimestepOptions sched;
  sched.flow_shift = 3.0;
  sched.integer_grid = true;
  const auto x0 = torch::rand({1, 3, 4, 4}).repeat({3, 1, 1, 1});
  const std::vector<int64_t> ts = {50, 500, 950};
  const auto a = make_eval_batch(x0, 7, 1, ts, sched);
  const auto b = make_eval_batch(x0, 7, 1, ts, sched);
  CHECK(torch::equal(a.noisy, b.noisy));
  CHECK_FALSE(a.dropped.any().item<bool>());
  for (size_t j = 0; j < ts.size(); ++j) {
    const double s = grid_sigma(ts[j], 1000, 3.0);
    CHECK(a.sigmas[static_cast<int64_t>(j)].item<double>() == Approx(s));
    CHECK(a.timesteps[static_cast<int64_t>(j)].item<double>() == std::trunc(s * 1000.0));
  }
  // Noise of (seed, sample, t): another sample or seed draws other noise; the training draw too.
  const auto other = make_eval_batch(x0, 8, 1, ts, sched);
  CHECK_FALSE(torch::equal(a.target, other.target));
  const auto eps = a.target[0] + x0[0];
  const auto training = make_flow_batch(x0.slice(0, 0, 1), {7}, 1, 50, sched);
  CHECK_FALSE(torch::allclose(eps, training.target[0] + x0[0]));
}
