#include "sana/distributed/check_dist.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/runtime.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::string human_bytes(int64_t b) {
  if (b >= (1 << 20)) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10)) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string store_text(const Runtime& rt) {
  if (rt.world_size() == 1) return "none (one process)";
  const auto& ep = rt.endpoint();
  return fmt::format("{}:{} hosted by {}", ep.host, ep.port,
                     ep.key_prefix.empty() ? "rank 0" : "the torchrun agent");
}

void print_device_map(const Runtime& rt) {
  std::cout << fmt::format("{:>5}  {:<20} {}\n", "rank", "host", "device");
  for (const auto& c : rt.device_map()) {
    std::cout << fmt::format("{:>5}  {:<20} {}\n", c.rank, c.host,
                             c.kind == "cpu" ? "cpu" : fmt::format("cuda:{} {}", c.index, c.id));
  }
}

// Times `iters` all-reduces of `bytes` and returns the slowest rank's seconds per op.
double time_all_reduce(Runtime& rt, int64_t bytes, int iters) {
  auto t = torch::full({bytes / 4}, 1.0f, torch::dtype(torch::kFloat32).device(rt.device()));
  for (int i = 0; i < 2; ++i) rt.all_reduce(t);  // warm-up: connections, buffers
  rt.barrier();
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) rt.all_reduce(t);
  if (t.is_cuda()) torch::cuda::synchronize(t.device().index());
  const double secs = std::chrono::duration<double>(Clock::now() - start).count() / iters;
  std::vector<double> all;
  for (const auto& s : rt.all_gather("time", fmt::format("{}", secs))) all.push_back(std::stod(s));
  return *std::max_element(all.begin(), all.end());
}

void bandwidth_table(Runtime& rt, const CheckDistOptions& opts) {
  const int w = rt.world_size();
  if (rt.rank() == 0) {
    std::cout << fmt::format("\nall-reduce (sum, float32), {} ranks, backend {}\n", w,
                             rt.backend_name());
    std::cout << fmt::format("{:>10} {:>6} {:>12} {:>12} {:>12}\n", "size", "iters", "time/op us",
                             "algbw GB/s", "busbw GB/s");
  }
  for (int64_t bytes : opts.sizes_bytes) {
    const int iters = static_cast<int>(std::clamp<int64_t>((256LL << 20) / bytes, 5, 200));
    const double secs = time_all_reduce(rt, bytes, iters);
    const double algbw = static_cast<double>(bytes) / secs / 1e9;
    const double busbw = algbw * 2.0 * (w - 1) / w;
    if (rt.rank() == 0) {
      std::cout << fmt::format("{:>10} {:>6} {:>12.1f} {:>12.3f} {:>12.3f}\n", human_bytes(bytes),
                               iters, secs * 1e6, algbw, busbw);
    }
  }
  std::cout.flush();
}

// All-reduces 1 MiB until rank 0 has seen `seconds` pass; checks every result.
void soak(Runtime& rt, double seconds) {
  const int w = rt.world_size();
  auto payload = torch::empty({1 << 18}, torch::dtype(torch::kFloat32).device(rt.device()));
  auto control = torch::zeros({1}, torch::dtype(torch::kFloat32).device(rt.device()));
  const auto start = Clock::now();
  auto last_report = start;
  int64_t ops = 0;
  const float expected = static_cast<float>(w * (w + 1) / 2);
  if (rt.rank() == 0) log::info("soak: all-reducing 1 MiB for {} s", seconds);
  while (true) {
    payload.fill_(static_cast<float>(rt.rank() + 1));
    rt.all_reduce(payload);
    ++ops;
    if (payload[0].item<float>() != expected || payload[-1].item<float>() != expected) {
      throw std::runtime_error(fmt::format("soak: all-reduce {} returned {} instead of {}", ops,
                                           payload[0].item<float>(), expected));
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    control.fill_(rt.rank() == 0 && elapsed >= seconds ? 1.0f : 0.0f);
    rt.all_reduce(control);  // rank 0 decides when every rank stops
    if (control.item<float>() > 0) break;
    if (rt.rank() == 0 && Clock::now() - last_report > std::chrono::seconds(5)) {
      log::info("soak: {:.0f} s, {} all-reduces of 1 MiB, all correct", elapsed, ops);
      last_report = Clock::now();
    }
  }
  if (rt.rank() == 0) {
    log::info("soak done: {} all-reduces of 1 MiB in {:.1f} s, all correct", ops,
              std::chrono::duration<double>(Clock::now() - start).count());
  }
}

}  // namespace

int run_check_dist(const LaunchEnv& env, const CheckDistOptions& opts) {
  const auto start = Clock::now();
  auto rt = Runtime::start(env, opts.runtime, {SANA_VERSION, opts.config_fingerprint}, opts.flight_dir);
  try {
    if (rt->rank() == 0) {
      std::cout << fmt::format(
          "check-dist: {} rank{} via {}, store {}, backend {}, {} thread{} per process, "
          "start-up {:.2f} s\n",
          rt->world_size(), rt->world_size() == 1 ? "" : "s", env.launcher, store_text(*rt),
          rt->backend_name(), rt->threads(), rt->threads() == 1 ? "" : "s",
          std::chrono::duration<double>(Clock::now() - start).count());
      print_device_map(*rt);
      std::cout << "agreement: world size, program version and config fingerprint match\n";
    }
    if (rt->world_size() > 1) bandwidth_table(*rt, opts);
    if (opts.soak_seconds > 0) soak(*rt, opts.soak_seconds);
    rt->finish();
  } catch (const std::exception& e) {
    rt->fail(e.what());  // tells the others what this rank saw, unless one already did
    throw;
  }
  if (rt->rank() == 0) std::cout << "check-dist: healthy\n";
  return kExitOk;
}

}  // namespace sana::dist
