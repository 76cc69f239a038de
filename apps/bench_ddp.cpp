// Training-step throughput and what overlapping the gradient all-reduce with the backward
// pass gains (a benchmark, not a test): each rank trains steps (forward, backward, sync,
// AdamW) of an unconditional pixel-space SanaMS preset on random data with the gradient
// reducer overlapped (buckets start during backward) and not (everything starts after
// backward), alternating; then times the all-reduce of all gradients alone. Rank 0 prints
// the median step of each, samples/s, and the share of the all-reduce hidden behind backward.
//   sana-train launch --nproc-per-node 2 -- build/apps/bench_ddp [PRESET] [STEPS] [SIDE] [BATCH]
// BENCH_PROFILE=FILE: rank 0 records its last step with torch's autograd profiler (a Chrome
// trace; scripts/bench/profile_ops.py sums it per operator). BENCH_PROFILE_SHAPES=FILE:
// rank 0's last step per operator and input shapes (self time, calls), a sorted table.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <fstream>
#include <map>
#include <mutex>
#include <torch/csrc/autograd/profiler_legacy.h>

#include "sana/config/loader.h"
#include "sana/parallel/reducer.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/train/options/core_options.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/options/torch_options.h"

using namespace sana;

namespace {

// Self time of every operator by its input shapes and caller, from RecordFunction callbacks: each
// thread keeps a stack of the operators it is in, and a finished one's time is taken off
// its caller's self time.
class ShapeProfile {
 public:
  ShapeProfile() {
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&ShapeProfile::enter, &ShapeProfile::leave).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  }
  ~ShapeProfile() { at::removeCallback(handle_); }
  void write(const std::string& path) const {
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(totals().begin(), totals().end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::ofstream out(path);
    for (const auto& [key, v] : rows) out << fmt::format("{:10.3f} ms {:6d} calls  {}\n", v.first / 1e3, v.second, key);
  }

 private:
  struct Mark : at::ObserverContext {};
  struct Frame {
    std::string key;
    std::chrono::steady_clock::time_point start;
    double children_us = 0;
  };
  static std::map<std::string, std::pair<double, int64_t>>& totals() {
    static std::map<std::string, std::pair<double, int64_t>> t;
    return t;
  }
  static std::vector<Frame>& stack() {
    thread_local std::vector<Frame> s;
    return s;
  }
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    std::string key = fn.name();
    for (const auto& input : fn.inputs()) {
      if (input.isTensor() && input.toTensor().defined()) key += fmt::format(" [{}]", fmt::join(input.toTensor().sizes(), ","));
    }
    if (!stack().empty()) key += "  < " + stack().back().key.substr(0, stack().back().key.find(' '));
    stack().push_back({key, std::chrono::steady_clock::now()});
    return std::make_unique<Mark>();
  }
  static void leave(const at::RecordFunction&, at::ObserverContext*) {
    auto& s = stack();
    if (s.empty()) return;
    const auto f = s.back();
    s.pop_back();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - f.start).count();
    if (!s.empty()) s.back().children_us += us;
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    auto& t = totals()[f.key];
    t.first += us - f.children_us;
    t.second += 1;
  }
  at::CallbackHandle handle_;
};

// The profiles BENCH_PROFILE and BENCH_PROFILE_SHAPES ask for, of rank 0's last step:
// recording while this lives, written when it ends.
class LastStepProfiles {
 public:
  explicit LastStepProfiles(bool last) {
    if (!last) return;
    if (const char* path = std::getenv("BENCH_PROFILE")) {
      trace_ = std::make_unique<torch::autograd::profiler::RecordProfile>(path);
    }
    if (const char* path = std::getenv("BENCH_PROFILE_SHAPES")) {
      shapes_ = std::make_unique<ShapeProfile>();
      shapes_path_ = path;
    }
  }
  ~LastStepProfiles() {
    if (shapes_) shapes_->write(shapes_path_);
  }

 private:
  std::unique_ptr<torch::autograd::profiler::RecordProfile> trace_;
  std::unique_ptr<ShapeProfile> shapes_;
  std::string shapes_path_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "SanaMS_small_P2_D8";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 6;
  const int64_t side = argc > 3 ? std::atoll(argv[3]) : 64;
  const int64_t batch = argc > 4 ? std::atoll(argv[4]) : 4;
  config::Config cfg;
  cfg.model.model = preset;
  cfg.vae.vae_type = config::VaeType::none;
  cfg.dist.timeout_s = 600;
  if (const char* threads = std::getenv("BENCH_THREADS")) cfg.dist.threads_per_process = std::atoi(threads);
  const auto env = dist::detect_launch_env();
  auto rt = dist::Runtime::start(env, sana::train::runtime_options_for(cfg, sana::train::TestHooks{}), {SANA_VERSION, config::config_fingerprint(cfg)});
  const auto spec = sana::train::model_spec_for(cfg);
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, 1});
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  auto overlapped = parallel::make_reducer(*rt, named);
  torch::manual_seed(static_cast<uint64_t>(rt->rank()));
  const auto x = torch::randn({batch, 3, side, side});
  const auto t = torch::rand({batch}) * 1000;
  std::vector<torch::Tensor> params;
  for (const auto& p : named) params.push_back(p.second);
  config::OptimizerConfig oc;
  oc.betas = {0.9, 0.999};
  oc.eps = {1e-10};
  auto opt = train::make_optimizer(train::optimizer_options_for(oc), named);
  std::vector<double> times[2];
  {
    parallel::ReducerOptions plain_opts;
    plain_opts.overlap = false;
    auto plain = parallel::make_reducer(*rt, named, plain_opts);
    for (int s = 0; s < 2 * steps + 2; ++s) {
      const bool overlap = s % 2 == 0;
      auto& sync = overlap ? *overlapped : *plain;
      // Only one engine may react to the hooks in a step: the other is told not to sync.
      (overlap ? *plain : *overlapped).begin_backward(false);
      rt->barrier();
      const LastStepProfiles profiles(rt->rank() == 0 && s == 2 * steps + 1);
      const auto start = std::chrono::steady_clock::now();
      sync.begin_backward(true);
      net->forward(x, t).pow(2).mean().backward();
      sync.finalize();
      opt->step(1e-4);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s >= 2) times[overlap ? 0 : 1].push_back(secs);  // the first two warm up
      sync.zero_gradients();
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The all-reduce of every gradient alone, as one flat tensor.
  auto flat = torch::zeros({net->parameter_count()});
  std::vector<double> comm;
  for (int i = 0; i < 5; ++i) {
    rt->barrier();
    const auto start = std::chrono::steady_clock::now();
    rt->all_reduce(flat);
    comm.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (rt->rank() == 0) {
    const double a = median(times[0]), b = median(times[1]), c = median(comm);
    std::cout << fmt::format(
        "sana-train {}: {} parameters, {} processes, batch {} of {}x{} per process, {} steps each\n"
        "  overlapped all-reduce: median step {:.3f} s, {:.1f} samples/s\n"
        "  all-reduce after backward: median step {:.3f} s\n"
        "  all-reduce of all gradients alone: {:.3f} s ({:.1f}% of a step); {}\n",
        spec.name, net->parameter_count(), rt->world_size(), batch, side, side, steps, a,
        rt->world_size() * batch / a, b, c, 100.0 * c / a,
        c < 0.05 * a ? std::string("too small a share to measure what overlap hides (step-to-step noise is larger)")
                     : fmt::format("hidden behind backward: {:.0f}%", 100.0 * std::clamp((b - a) / c, 0.0, 1.0)));
  }
  rt->finish();
  return 0;
}
