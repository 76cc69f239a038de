// Our numerics against upstream Sana's, as tests/reference/upstream_numerics.py computes them
// from upstream's own code paths (numpy/torch, upstream's dtypes and step order): the
// training timestep table and the integer timesteps the model sees, the learning rate of
// every step, the samplers' noise levels and results, and the sin-cos position embedding.
#include "catch.h"
#include <fmt/format.h>
#include <torch/torch.h>

#include "sana/diffusion/flow_matching.h"
#include "sana/diffusion/sampler.h"
#include "sana/model/pos_embed.h"
#include "sana/train/options/core_options.h"
#include "sana/util/safetensors.h"
#include "test_support.h"

using namespace sana;

namespace {

const SafetensorsFile& upstream() {
  static const SafetensorsFile file =
      read_safetensors(sana::test::reference_fixtures("upstream_numerics.py").path("upstream.safetensors"));
  return file;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

torch::Tensor as_tensor(const std::vector<double>& v) { return torch::tensor(v, torch::kFloat64); }

}  // namespace

TEST_CASE("the training grid and its integer timesteps are upstream's, entry by entry", "[diffusion][upstream]") {
  for (int shift : {1, 3}) {
    INFO("flow_shift " << shift);
    std::vector<double> sigma, t;
    for (int64_t i = 0; i < 1000; ++i) {
      sigma.push_back(diffusion::grid_sigma(i, 1000, shift));
      t.push_back(std::trunc(sigma.back() * 1000.0));
    }
    CHECK(max_diff(as_tensor(sigma), upstream().get(fmt::format("train_sigma_s{}", shift))) < 1e-15);
    // Exactly, truncation artefacts included (with shift 1, t = 61 reaches the model as 60).
    CHECK(torch::equal(as_tensor(t), upstream().get(fmt::format("train_t_s{}", shift))));
  }
  CHECK(upstream().get("train_t_s1")[61].item<double>() == 60.0);
}

TEST_CASE("the learning rate of every step is diffusers' / upstream's", "[train][upstream]") {
  config::TrainConfig t;
  t.optimizer.lr = 1e-3;
  t.auto_lr = config::AutoLr::none;
  t.lr_schedule_args.num_warmup_steps = 10;
  t.lr_schedule_args.final_lr_ratio = 0.1;
  const std::pair<config::LrSchedule, const char*> cases[] = {
      {config::LrSchedule::constant, "lr_constant"},
      {config::LrSchedule::cosine, "lr_cosine"},
      {config::LrSchedule::cosine_decay_to_constant, "lr_decay"},
  };
  for (const auto& [schedule, name] : cases) {
    INFO(name);
    t.lr_schedule = schedule;
    std::vector<double> ours;
    for (int64_t step = 0; step < 120; ++step) ours.push_back(train::learning_rate(train::lr_schedule_options_for(t), step, 110));
    CHECK(max_diff(as_tensor(ours), upstream().get(name)) < 1e-15);
  }
}

TEST_CASE("the samplers visit upstream's noise levels and reach upstream's result", "[sampling][upstream]") {
  // Upstream builds DPM-Solver's grid in float32 and diffusers' Euler grid partly in float32.
  const auto dpm = diffusion::sigma_schedule(20, 3.0, "flow_dpm-solver");
  CHECK(max_diff(as_tensor(dpm), upstream().get("dpm_grid_20_s3")) < 1e-6);
  const auto euler = diffusion::sigma_schedule(28, 3.0, "flow_euler");
  CHECK(max_diff(as_tensor(euler), upstream().get("euler_grid_28_s3")) < 1e-6);
  // The same toy velocity through both solvers: same orders, same updates.
  const diffusion::Velocity v = [](const torch::Tensor& x, double s) { return x * (1 + s); };
  const auto noise = upstream().get("toy_noise");
  CHECK(max_diff(diffusion::sample_flow(v, noise, 20, 3.0, "flow_dpm-solver"), upstream().get("dpm_toy")) < 1e-5);
  CHECK(max_diff(diffusion::sample_flow(v, noise, 28, 3.0, "flow_euler"), upstream().get("euler_toy")) < 1e-5);
}

TEST_CASE("the sin-cos position embedding is upstream's get_2d_sincos_pos_embed", "[model][upstream]") {
  CHECK(max_diff(model::sincos_pos_embed(32, 4, 6, 1.0, 4), upstream().get("pe_4x6_i1")) < 1e-6);
  CHECK(max_diff(model::sincos_pos_embed(32, 6, 4, 2.0, 4), upstream().get("pe_6x4_i2")) < 1e-6);
}
