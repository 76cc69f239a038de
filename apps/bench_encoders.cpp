// Benchmark: the native Gemma-2's forward on the CPU, for scripts/bench/encoders_cpu.py to
// set beside transformers' at the same threads (a benchmark, not a test: it prints figures).
//   bench_encoders gemma2 FOLDER BATCH TOKENS REPEATS
// Loads the folder in fp32, runs one warm-up forward on BATCH rows of TOKENS random ids (the
// last row half padding), then REPEATS timed ones; prints each time and the median in ms.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "sana/model/gemma2.h"

int main(int argc, char** argv) {
  if (argc != 6 || std::string(argv[1]) != "gemma2") {
    std::cerr << "usage: bench_encoders gemma2 FOLDER BATCH TOKENS REPEATS\n";
    return 2;
  }
  const std::string folder = argv[2];
  const int64_t batch = std::atoll(argv[3]), tokens = std::atoll(argv[4]), repeats = std::atoll(argv[5]);
  const auto model = sana::model::Gemma2::load(folder, torch::kCPU, torch::kFloat32);
  torch::manual_seed(0);
  const auto ids = torch::randint(3, model.config().vocab_size, {batch, tokens}, torch::kInt64);
  auto mask = torch::ones({batch, tokens}, torch::kInt64);
  mask.index_put_({batch - 1, torch::indexing::Slice(tokens / 2)}, 0);
  (void)model.forward(ids, mask);
  std::vector<double> ms;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = model.forward(ids, mask);
    (void)out.sum().item<float>();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::cout << fmt::format("forward {}: {:.1f} ms\n", r + 1, ms.back());
  }
  std::sort(ms.begin(), ms.end());
  std::cout << fmt::format("median {:.1f} ms ({} threads)\n", ms[ms.size() / 2], torch::get_num_threads());
  return 0;
}
