// Benchmark: the native Gemma-2's forward and DC-AE's encode and decode on the CPU, for
// scripts/bench/encoders_cpu.py to set beside transformers' and diffusers' at the same threads
// (a benchmark, not a test: it prints figures).
//   bench_encoders gemma2 FOLDER BATCH TOKENS REPEATS
//   bench_encoders dc-ae FOLDER BATCH SIZE REPEATS
// Loads the folder in fp32 (timed: reading the safetensors), runs one warm-up pass, then
// REPEATS timed ones; prints each time and the median in ms. Gemma-2: BATCH rows of TOKENS random ids (the last row half padding).
// DC-AE: BATCH random images of SIZE x SIZE encoded, then their latents decoded (a median each).
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "sana/model/dc_ae.h"
#include "sana/model/gemma2.h"

namespace {

// REPEATS timed calls of `f` after one warm-up: each printed as "LABEL R: MS ms", then the median.
template <class F>
double median_ms(const char* label, int64_t repeats, F f) {
  (void)f();
  std::vector<double> ms;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)f().sum().template item<float>();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::cout << fmt::format("{} {}: {:.1f} ms\n", label, r + 1, ms.back());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc == 6 ? argv[1] : "";
  if (what != "gemma2" && what != "dc-ae") {
    std::cerr << "usage: bench_encoders gemma2 FOLDER BATCH TOKENS REPEATS\n"
                 "       bench_encoders dc-ae FOLDER BATCH SIZE REPEATS\n";
    return 2;
  }
  const std::string folder = argv[2];
  const int64_t batch = std::atoll(argv[3]), size = std::atoll(argv[4]), repeats = std::atoll(argv[5]);
  torch::InferenceMode inference;
  torch::manual_seed(0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto load_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  if (what == "dc-ae") {
    const auto vae = sana::model::DcAe::load(folder, torch::kCPU, torch::kFloat32);
    const double load = load_ms();
    const auto images = torch::rand({batch, 3, size, size}) * 2 - 1;
    const double encode = median_ms("encode", repeats, [&] { return vae.encode(images); });
    const auto latents = vae.encode(images);
    const double decode = median_ms("decode", repeats, [&] { return vae.decode(latents); });
    std::cout << fmt::format("median encode {:.1f} ms decode {:.1f} ms load {:.1f} ms ({} threads)\n", encode, decode,
                             load, torch::get_num_threads());
    return 0;
  }
  const auto model = sana::model::Gemma2::load(folder, torch::kCPU, torch::kFloat32);
  const double load = load_ms();
  const int64_t tokens = size;
  const auto ids = torch::randint(3, model.config().vocab_size, {batch, tokens}, torch::kInt64);
  auto mask = torch::ones({batch, tokens}, torch::kInt64);
  mask.index_put_({batch - 1, torch::indexing::Slice(tokens / 2)}, 0);
  const double forward = median_ms("forward", repeats, [&] { return model.forward(ids, mask); });
  std::cout << fmt::format("median {:.1f} ms load {:.1f} ms ({} threads)\n", forward, load, torch::get_num_threads());
  return 0;
}
