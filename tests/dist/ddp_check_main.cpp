// A multi-process check of the gradient reducer: every rank computes the gradient of its
// slice of a global batch of G samples (with or without gradient accumulation) through
// parallel::make_reducer(), and compares the synced gradient with a single-process gradient
// over all G samples computed locally. One extra parameter never takes part in the forward: it must
// come back zero-filled on every rank, without desynchronising (tests/dist/ddp.sh checks
// that the reducer's warning names it). Every gradient must live in the reducer's flat
// buckets (views, no copies), also after a gradient was replaced by another tensor, and the
// flat buckets must hold each gradient element exactly once.
//   ddp_check ACCUMULATION   (under a launcher; G = 12)
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "sana/config/loader.h"
#include "sana/diffusion/flow_matching.h"
#include "sana/parallel/reducer.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/train/options/core_options.h"
#include "model_specs.h"

namespace {

using namespace sana;

model::ModelSpec spec() {
  auto s = test::small_spec(model::Conditioning::class_label);
  s.num_classes = 4;
  return s;
}

// Loss of samples [first, first + n) of the global batch, scaled as the trainer scales it.
torch::Tensor loss_of(model::SanaMS& net, const torch::Tensor& x0, const torch::Tensor& labels, int64_t first,
                      int64_t n, double scale) {
  std::vector<uint32_t> ids;
  for (int64_t i = first; i < first + n; ++i) ids.push_back(static_cast<uint32_t>(100 + i));
  const auto xs = x0.narrow(0, first, n);
  const auto fb = diffusion::make_flow_batch(xs, ids, 3, 0, diffusion::TimestepOptions{}, 0.25);
  model::Condition c{labels.narrow(0, first, n), {}, fb.dropped, {}, 1.0, {}};
  return diffusion::flow_loss(net->forward(fb.noisy, fb.timesteps, c), fb.target) * scale;
}

int run(int accumulation) {
  config::Config cfg;
  cfg.dist.timeout_s = 60;
  const auto env = dist::detect_launch_env();
  auto rt = dist::Runtime::start(env, train::runtime_options_for(cfg, train::TestHooks::from_environment()),
                                 {SANA_VERSION, config::config_fingerprint(cfg)});
  const int W = rt->world_size(), r = rt->rank();
  const int64_t G = 12;
  if (G % (W * accumulation) != 0) throw std::runtime_error("G must divide");
  const int64_t micro = G / (W * accumulation);
  torch::manual_seed(7);  // the same batch on every rank
  const auto x0 = torch::randn({G, 3, 8, 16});
  const auto labels = torch::randint(0, 4, {G}, torch::kInt64);

  model::SanaMS net(spec(), model::BuildOptions{torch::kFloat32, false, 5});
  auto unused = torch::zeros({3}, torch::requires_grad());
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  named.emplace_back("never_used.weight", unused);
  parallel::ReducerOptions opts;
  opts.bucket_cap_mb = 0.05;
  opts.first_bucket_mb = 0.01;
  auto sync = parallel::make_reducer(*rt, named, opts);

  // Two optimizer steps' worth of backward, to check the per-step reset too.
  for (int round = 0; round < 2; ++round) {
    for (auto& [name, p] : named) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    // As code outside the reducer might: a new gradient tensor, which begin_backward takes back.
    if (round == 1) named.front().second.mutable_grad() = torch::zeros_like(named.front().second);
    for (int64_t a = 0; a < accumulation; ++a) {
      const int64_t first = (a * W + r) * micro;  // micro-step a of rank r (docs/epoch_plan.md)
      sync->begin_backward(a == accumulation - 1);
      loss_of(net, x0, labels, first, micro, 1.0 / static_cast<double>(accumulation)).backward();
    }
    sync->finalize();
  }
  std::vector<torch::Tensor> synced;
  for (auto& [name, p] : named) synced.push_back(p.grad().clone());

  // The single-process gradient over all G samples.
  model::SanaMS ref(spec(), model::BuildOptions{torch::kFloat32, false, 5});
  loss_of(ref, x0, labels, 0, G, 1.0).backward();
  double worst = 0;
  std::string worst_name;
  size_t i = 0;
  for (const auto& p : ref->named_parameters()) {
    const auto g = p.value().grad();
    // Relative difference of the whole tensor: ||synced - single|| / ||single||.
    const double rel = (synced[i] - g).norm().item<double>() / std::max(g.norm().item<double>(), 1e-30);
    if (rel > worst) {
      worst = rel;
      worst_name = p.key();
    }
    ++i;
  }
  const bool zero_filled = synced.back().defined() && synced.back().abs().sum().item<double>() == 0;
  // Views: every gradient's bytes inside one flat bucket, no two overlapping (each element
  // once; the buckets may hold alignment gaps besides).
  const auto flats = sync->flat_gradients();
  size_t views = 0;
  std::vector<std::pair<const char*, size_t>> spans;
  for (const auto& [name, p] : named) {
    const auto* g = static_cast<const char*>(p.grad().data_ptr());
    spans.emplace_back(g, p.grad().nbytes());
    views += std::any_of(flats.begin(), flats.end(), [&](const torch::Tensor& f) {
      const auto* begin = static_cast<const char*>(f.data_ptr());
      return g >= begin && g + p.grad().nbytes() <= begin + f.nbytes();
    });
  }
  std::sort(spans.begin(), spans.end());
  bool disjoint = true;
  for (size_t i = 1; i < spans.size(); ++i) disjoint &= spans[i - 1].first + spans[i - 1].second <= spans[i].first;
  const bool all_views = views == named.size() && disjoint;
  std::cout << fmt::format("rank {}: world {}, accumulation {}, {} buckets; max relative gradient difference "
                           "{:.3e} ({}, L2 over the tensor); unused parameter zero-filled: {}; gradients "
                           "that are views into the buckets: {} of {}\n",
                           r, W, accumulation, sync->bucket_count(), worst, worst_name, zero_filled ? "yes" : "no",
                           views, named.size())
            << std::flush;
  rt->finish();
  return worst <= 1e-6 && zero_filled && all_views ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? std::atoi(argv[1]) : 1);
  } catch (const std::exception& e) {
    std::cerr << "ddp_check failed: " << e.what() << "\n";
    return 1;
  }
}
