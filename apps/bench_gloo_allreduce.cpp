// Benchmark: raw c10d Gloo all-reduce, none of sana-train's runtime, as the baseline for
// `sana-train check-dist`. Same sizes, iteration counts and timing rule. Run it under any
// torchrun-style launcher:
//   sana-train launch --nproc-per-node 2 -- build/apps/bench_gloo_allreduce
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "sana/torch_compat.h"

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}
}  // namespace

int main() {
  const int rank = env_int("RANK", 0);
  const int world = env_int("WORLD_SIZE", 1);
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = env_int("MASTER_PORT", 29500);
  const auto timeout = std::chrono::seconds(60);
  torch::set_num_threads(1);

  auto store = c10::make_intrusive<c10d::TCPStore>(
      addr ? addr : "127.0.0.1",
      sana::compat::tcp_store_options(static_cast<uint16_t>(port), rank == 0, timeout));
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 2;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);

  if (rank == 0) {
    std::cout << fmt::format("raw c10d Gloo all-reduce (sum, float32), {} ranks\n", world);
    std::cout << fmt::format("{:>10} {:>6} {:>12} {:>12} {:>12}\n", "size", "iters", "time/op us",
                             "algbw GB/s", "busbw GB/s");
  }
  for (int64_t bytes : {1LL << 10, 16LL << 10, 256LL << 10, 1LL << 20, 4LL << 20, 16LL << 20,
                        64LL << 20}) {
    const int iters = static_cast<int>(std::clamp<int64_t>((256LL << 20) / bytes, 5, 200));
    std::vector<torch::Tensor> t{torch::full({bytes / 4}, 1.0f)};
    for (int i = 0; i < 2; ++i) pg->allreduce(t)->wait();
    pg->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pg->allreduce(t)->wait();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    std::vector<torch::Tensor> worst{torch::tensor({secs}, torch::kFloat64)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    pg->allreduce(worst, max)->wait();
    const double s = worst[0].item<double>();
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    if (rank == 0) {
      std::cout << fmt::format("{:>10} {:>6} {:>12.1f} {:>12.3f} {:>12.3f}\n",
                               bytes >= (1 << 20) ? fmt::format("{} MiB", bytes >> 20)
                                                  : fmt::format("{} KiB", bytes >> 10),
                               iters, s * 1e6, algbw, algbw * 2.0 * (world - 1) / world);
    }
  }
  pg->barrier()->wait();
  return 0;
}
