// What overlapping the gradient all-reduce with the backward pass gains (a benchmark, not
// a test): each rank trains steps of a SanaMS preset on random data with GradSync
// overlapped (buckets start during backward) and not (everything starts after backward),
// alternating, and rank 0 prints the median step time of each.
//   sana-train launch --nproc-per-node 2 -- build/apps/bench_ddp [PRESET] [STEPS] [SIDE] [BATCH]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "sana/config/loader.h"
#include "sana/dist/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/train/grad_sync.h"

using namespace sana;

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "SanaMS_small_P2_D8";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 6;
  const int64_t side = argc > 3 ? std::atoll(argv[3]) : 64;
  const int64_t batch = argc > 4 ? std::atoll(argv[4]) : 4;
  config::Config cfg;
  cfg.model.model = preset;
  cfg.vae.vae_type = "none";
  cfg.dist.timeout_s = 600;
  const auto env = dist::detect_launch_env();
  auto rt = dist::Runtime::start(env, cfg.dist, {SANA_VERSION, config::config_fingerprint(cfg)});
  const auto spec = model::spec_from_config(cfg);
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, 1});
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  train::GradSync overlapped(*rt, named, 25.0, 1.0, true);
  torch::manual_seed(static_cast<uint64_t>(rt->rank()));
  const auto x = torch::randn({batch, 3, side, side});
  const auto t = torch::rand({batch}) * 1000;
  std::vector<double> times[2];
  {
    train::GradSync plain(*rt, named, 25.0, 1.0, false);
    for (int s = 0; s < 2 * steps + 2; ++s) {
      const bool overlap = s % 2 == 0;
      auto& sync = overlap ? overlapped : plain;
      // Only one engine may react to the hooks in a step: the other is told not to sync.
      (overlap ? plain : overlapped).begin_backward(false);
      rt->barrier();
      const auto start = std::chrono::steady_clock::now();
      sync.begin_backward(true);
      net->forward(x, t).pow(2).mean().backward();
      sync.finish();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s >= 2) times[overlap ? 0 : 1].push_back(secs);  // the first two warm up
      for (auto& p : net->parameters()) p.mutable_grad().zero_();
    }
  }
  if (rt->rank() == 0) {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double a = median(times[0]), b = median(times[1]);
    std::cout << fmt::format(
        "{}: {} parameters, {} processes, batch {} of {}x{} per process, {} steps each\n"
        "  overlapped all-reduce: median step {:.3f} s\n"
        "  all-reduce after backward: median step {:.3f} s\n"
        "  overlap saves {:.1f}% of a step\n",
        spec.name, net->parameter_count(), rt->world_size(), batch, side, side, steps, a, b, 100.0 * (b - a) / b);
  }
  rt->finish();
  return 0;
}
