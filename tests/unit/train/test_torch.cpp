// The tensor side as a user would notice it: LibTorch's own BLAS on the process's threads, and a short real
// training run whose loss goes down.
#include "catch.h"

#include <filesystem>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "sana/data/distributed_sampler.h"
#include "sana/distributed/runtime.h"
#include "sana/util/safetensors.h"
#include "test_support.h"

using sana::test::run_command;
using sana::test::TempDir;

TEST_CASE("LibTorch's products run in its own BLAS (MKL) on LibTorch's threads", "[torch][blas]") {
  // pip's torch carries MKL, linked in: no system BLAS is looked up (Debian's LibTorch took
  // whichever libblas.so.3 was selected, and the reference one made a DiT step 14x slower).
  // MKL runs on ATen's OpenMP pool, so the process's thread setting is the products' too.
  CHECK(at::globalContext().hasMKL());
  const int before = torch::get_num_threads();
  sana::dist::set_compute_threads(2);
  CHECK(torch::get_num_threads() == 2);
  const auto a = torch::randn({256, 256}, torch::kFloat64);
  CHECK(torch::allclose(torch::mm(a, torch::eye(256, torch::kFloat64)), a));
  sana::dist::set_compute_threads(before);
}

TEST_CASE("a short training run on real images lowers the loss", "[torch][train]") {
  TempDir dir;
  const std::string cmd = std::string(SANA_TRAIN_BIN) + " --config " + SANA_SOURCE_DIR +
                          "/configs/sana_tiny_cpu.yaml --data.data_dir=/usr/share/backgrounds/mate"
                          " --train.max_steps=40 --work_dir=" + dir.path("run");
  const auto r = run_command(cmd);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // metrics.jsonl: one line per optimizer step with epoch, step (from 1) and loss.
  std::ifstream metrics(dir.path("run/metrics.jsonl"));
  std::vector<double> losses;
  std::string line;
  int64_t expect_step = 1;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j.at("step").get<int64_t>() == expect_step++);
    CHECK(j.at("epoch").get<int64_t>() >= 1);
    losses.push_back(j.at("loss").get<double>());
  }
  REQUIRE(losses.size() == 40);
  const double first = (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
  const double last = (losses[35] + losses[36] + losses[37] + losses[38] + losses[39]) / 5;
  INFO("mean loss of the first 5 steps " << first << ", of the last 5 " << last);
  CHECK(last < 0.6 * first);
  CHECK(r.output.find("parameters identical on all 1 rank") != std::string::npos);
  // The report: three PNG plots and a summary.
  for (const char* plot : {"loss.png", "lr.png", "samples_per_s.png"}) {
    std::ifstream png(dir.path("run/report/") + plot, std::ios::binary);
    char magic[4] = {};
    png.read(magic, 4);
    CHECK(std::string(magic + 1, 3) == "PNG");
  }
  const auto report = run_command(std::string(SANA_TRAIN_BIN) + " report " + dir.path("run"));
  CHECK(report.exit_code == 0);
  CHECK(report.output.find("steps: 40") != std::string::npos);
  // The log file in work_dir holds the same lines, and the resolved config is saved.
  std::ifstream log(dir.path("run/train.log"));
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CHECK(text.find("done: 40 steps") != std::string::npos);
  const auto printed = run_command(std::string(SANA_TRAIN_BIN) + " --config " +
                                   dir.path("run/config.yaml") + " --print-config");
  CHECK(printed.exit_code == 0);
  CHECK(printed.output.find("max_steps: 40") != std::string::npos);
  // The trained weights and preview grids (square, tallest, widest bucket) are written.
  CHECK(std::filesystem::file_size(dir.path("run/model.safetensors")) > 1'000'000);
  for (const char* grid : {"step000040_32x32.png", "step000040_64x16.png", "step000040_16x64.png"}) {
    CHECK(std::filesystem::exists(dir.path("run/previews/") + grid));
  }
  // `preview` samples from those weights; weights of another model are refused by name.
  const std::string preview = std::string(SANA_TRAIN_BIN) + " preview --config " + SANA_SOURCE_DIR +
                              "/configs/sana_tiny_cpu.yaml --weights " + dir.path("run/model.safetensors");
  const auto shown = run_command(preview + " --out " + dir.path("shown"));
  INFO(shown.output);
  CHECK(shown.exit_code == 0);
  CHECK(std::filesystem::exists(dir.path("shown/preview_64x16.png")));
  const auto refused = run_command(preview + " --model.model=SanaMS_tiny_P4_D4 --out " + dir.path("x"));
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("x_embedder.proj.weight (file 128x3x2x2, model 128x3x4x4)") != std::string::npos);
}

TEST_CASE("the EMA is updated before the optimizer step, as upstream", "[torch][train][ema]") {
  // Start from known weights W, take one step (no warmup) with ema_rate 0.5. Upstream's
  // order averages W with W (the weights before the step): the EMA is W. Averaging after the
  // step would give (W + W') / 2.
  TempDir dir;
  const std::string base = std::string(SANA_TRAIN_BIN) + " --config " + SANA_SOURCE_DIR +
                           "/configs/sana_tiny_cpu.yaml --data.data_dir=/usr/share/backgrounds/mate"
                           " --train.max_steps=1 --train.visualize=false --train.lr_schedule_args.num_warmup_steps=0";
  const auto first = run_command(base + " --work_dir=" + dir.path("a"));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto second = run_command(base + " --train.ema_update=true --train.ema_rate=0.5 --model.load_from=" +
                                  dir.path("a/model.safetensors") + " --work_dir=" + dir.path("b"));
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  const auto w = sana::read_safetensors(dir.path("a/model.safetensors"));
  const auto stepped = sana::read_safetensors(dir.path("b/model.safetensors"));
  const auto ema = sana::read_safetensors(dir.path("b/ema.safetensors"));
  REQUIRE(ema.tensors.size() > 10);
  double moved = 0;
  for (const auto& [name, average] : ema.tensors) {
    INFO(name);
    CHECK(torch::allclose(average, w.get(name), 1e-6, 1e-7));
    moved = std::max(moved, (stepped.get(name) - w.get(name)).abs().max().item<double>());
  }
  CHECK(moved > 1e-4);  // the step did change the weights
}

TEST_CASE("the distributed sampler partitions exactly as torch's DistributedSampler",
          "[torch][sampler]") {
  // Each case: n, world, seed, epoch, shuffle, drop_last. Debian's python3-torch runs
  // torch's own DistributedSampler as the reference.
  const nlohmann::json cases = {{10, 3, 0, 0, 1, 0},  {10, 3, 0, 0, 1, 1},   {11, 4, 42, 3, 1, 0},
                                {11, 4, 42, 3, 1, 1}, {7, 8, 1, 0, 1, 0},    {100, 6, 5, 2, 0, 0},
                                {100, 6, 5, 2, 0, 1}, {1000, 8, 123, 7, 1, 0}, {3, 2, 9, 9, 1, 1},
                                {64, 1, 2, 1, 1, 0},  {5000, 3, 77, 11, 1, 1}};
  const auto r = run_command(SANA_PYTHON " " + std::string(SANA_SOURCE_DIR) +
                             "/tests/reference/distributed_sampler.py '" + cases.dump() +
                             "' 2>/dev/null");
  REQUIRE(r.exit_code == 0);
  const auto expected = nlohmann::json::parse(r.output);
  REQUIRE(expected.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const int world = c[1];
    for (int rank = 0; rank < world; ++rank) {
      INFO("case " << c.dump() << " rank " << rank);
      const auto ours = sana::data::distributed_sampler_indices(
          c[0], world, rank, c[2], c[3], c[4] == 1, c[5] == 1);
      CHECK(ours == expected[i][static_cast<size_t>(rank)].get<std::vector<int64_t>>());
    }
  }
}
