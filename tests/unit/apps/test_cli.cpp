// The real sana-train binary: help, --print-config, overrides and exit codes.
#include "catch.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

using sana::test::run_command;
using sana::test::TempDir;

namespace {
const std::string kBin = SANA_TRAIN_BIN;
const std::string kTiny = std::string(SANA_SOURCE_DIR) + "/configs/sana_tiny_cpu.yaml";
}  // namespace

TEST_CASE("help lists the commands and the most used keys", "[cli]") {
  const auto r = run_command(kBin + " --help");
  CHECK(r.exit_code == 0);
  for (const char* text : {"--config", "--print-config", "--list-keys", "--train.optimizer.lr",
                           "--train.global_batch_size", "--resume_from", "--data.data_dir"}) {
    INFO(text);
    CHECK(r.output.find(text) != std::string::npos);
  }
}

TEST_CASE("help's command list names every subcommand the command line has", "[cli]") {
  const auto r = run_command(kBin + " --help");
  REQUIRE(r.exit_code == 0);
  // The subcommands as CLI11 lists them (its own "Subcommands:" section), each in ours.
  std::istringstream lines(r.output);
  std::vector<std::string> names;
  bool in_list = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Subcommands:", 0) == 0 || line.rfind("SUBCOMMANDS:", 0) == 0) {
      in_list = true;
    } else if (in_list && line.empty()) {
      break;
    } else if (in_list) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      names.push_back(name);
    }
  }
  CHECK(names.size() >= 11);
  for (const char* expected : {"export", "prepare-features", "launch", "inspect"}) {
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  }
  const auto commands = r.output.substr(r.output.find("\nCommands:\n"));
  for (const auto& name : names) {
    INFO(name);
    CHECK(commands.find("  sana-train " + name + " ") != std::string::npos);
  }
}

TEST_CASE("list-keys lists every key with its type and default", "[cli]") {
  const auto r = run_command(kBin + " --list-keys");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("train.optimizer.betas") != std::string::npos);
  CHECK(r.output.find("dist.timeout_s") != std::string::npos);
  CHECK(r.output.find("[AdamW|CAME|CAME8bit|AdamW8bit|Lion|Adafactor|Prodigy|ScheduleFreeAdamW]") != std::string::npos);
}

TEST_CASE("print-config through the binary round-trips with overrides applied", "[cli]") {
  TempDir dir;
  const auto first = run_command(kBin + " --config " + kTiny +
                                 " --train.optimizer.lr=2.5e-4 --train.seed 9 --print-config");
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("lr: 0.00025") != std::string::npos);
  CHECK(first.output.find("seed: 9") != std::string::npos);
  const std::string printed = dir.write("printed.yaml", first.output);
  const auto second = run_command(kBin + " --config " + printed + " --print-config");
  REQUIRE(second.exit_code == 0);
  CHECK(second.output == first.output);
}

TEST_CASE("usage and config errors exit with code 2 and no stack trace", "[cli]") {
  SECTION("no config") {
    const auto r = run_command(kBin);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("--config FILE is required") != std::string::npos);
  }
  SECTION("a missing config file") {
    const auto r = run_command(kBin + " --config /nonexistent/x.yaml");
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("config file '/nonexistent/x.yaml' not found") != std::string::npos);
  }
  SECTION("an unknown option-like override") {
    const auto r = run_command(kBin + " --config " + kTiny + " --trian.seed=3 --print-config");
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("trian: unknown section") != std::string::npos);
    CHECK(r.output.find("did you mean train?") != std::string::npos);
    CHECK(r.output.find("terminate") == std::string::npos);
  }
  SECTION("a launcher environment with more processes than samples per step") {
    const auto r = run_command("RANK=0 WORLD_SIZE=9 " + kBin + " --config " + kTiny);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("8 is smaller than the world size 9") != std::string::npos);
  }
  SECTION("a broken launcher environment names the variable") {
    const auto r = run_command("env -u WORLD_SIZE RANK=0 " + kBin + " --config " + kTiny);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("WORLD_SIZE is not set") != std::string::npos);
  }
}

namespace {
nlohmann::json plan_json(const std::string& work, int world, int rank, int epoch) {
  // Only stdout: the log goes to stderr.
  const auto r = run_command("{ " + kBin + " plan --config " + kTiny +
                             " --data.data_dir=/usr/share/backgrounds/mate --work_dir=" + work +
                             " --train.global_batch_size=8 --train.micro_batch_size=2 --json" +
                             " --world-size " + std::to_string(world) + " --rank " +
                             std::to_string(rank) + " --epoch " + std::to_string(epoch) +
                             " 2>/dev/null; }");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.output);
}
}  // namespace

TEST_CASE("plan --json: every world size slices the same global batches", "[cli][plan]") {
  TempDir dir;
  const auto whole = plan_json(dir.path("w"), 1, 0, 0);
  CHECK(whole["num_samples"] == 30);
  const int steps = whole["steps_per_epoch"];
  REQUIRE(steps > 0);
  CHECK(whole["steps"].size() == static_cast<size_t>(steps));
  for (int world : {2, 4}) {
    std::vector<nlohmann::json> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(plan_json(dir.path("w"), world, r, 0));
    for (int s = 0; s < steps; ++s) {
      std::multiset<int> joined;
      for (const auto& p : ranks) {
        CHECK(p["steps_per_epoch"] == steps);
        CHECK(p["steps"][static_cast<size_t>(s)].size() == static_cast<size_t>(8 / world));
        for (int id : p["steps"][static_cast<size_t>(s)]) joined.insert(id);
      }
      const std::vector<int> batch = whole["steps"][static_cast<size_t>(s)];
      CHECK(joined == std::multiset<int>(batch.begin(), batch.end()));
    }
  }
  CHECK(plan_json(dir.path("w"), 1, 0, 1)["fingerprint"] != whole["fingerprint"]);
}

TEST_CASE("plan prints a bucket histogram and refuses a world size the batch cannot fit",
          "[cli][plan]") {
  TempDir dir;
  const std::string base = kBin + " plan --config " + kTiny +
                           " --data.data_dir=/usr/share/backgrounds/mate --work_dir=" +
                           dir.path("w");
  const auto r = run_command(base);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("steps per epoch:") != std::string::npos);
  CHECK(r.output.find("32: 0.6 -> 24x40") != std::string::npos);  // 16:10 wallpapers
  const auto three = run_command(base + " --world-size 3 --rank 2");
  CHECK(three.exit_code == 0);
  CHECK(three.output.find("rank 2 of 3: 2 samples per step") != std::string::npos);
  const auto bad = run_command(base + " --world-size 9");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("smaller than the world size 9") != std::string::npos);
}

TEST_CASE("check-data counts bad samples by reason and fails past max_bad_fraction", "[cli][data]") {
  TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir.path("d"));
  for (const auto& e : fs::directory_iterator("/usr/share/backgrounds/mate/nature")) {
    fs::copy_file(e.path(), dir.path("d/" + e.path().filename().string()));
  }
  dir.write("d/zero.jpg", "");
  dir.write("d/notes.png", "plain text");
  const std::string base = kBin + " check-data --config " + kTiny + " --data.data_dir=" +
                           dir.path("d") + " --work_dir=" + dir.path("w");
  const auto strict = run_command(base);
  CHECK(strict.exit_code == 1);
  CHECK(strict.output.find("check-data: 14 samples") != std::string::npos);
  CHECK(strict.output.find("good: 12") != std::string::npos);
  CHECK(strict.output.find("bad, empty: 1") != std::string::npos);
  CHECK(strict.output.find("bad, not an image: 1") != std::string::npos);
  CHECK(strict.output.find("'" + dir.path("d/zero.jpg") + "': empty") != std::string::npos);
  const auto lenient = run_command(base + " --data.max_bad_fraction=0.5 --limit 13");
  CHECK(lenient.exit_code == 0);
  CHECK(lenient.output.find("check-data: 13 samples") != std::string::npos);
  CHECK(lenient.output.find("check-data: ok") != std::string::npos);
}

TEST_CASE("plan with data.sampler=distributed gives each rank torch's DistributedSampler list",
          "[cli][plan]") {
  TempDir dir;
  const std::string base = kBin + " plan --config " + kTiny +
                           " --data.data_dir=/usr/share/backgrounds/mate --work_dir=" +
                           dir.path("w") + " --model.multi_scale=false --data.sampler=distributed" +
                           " --train.seed=3 --train.global_batch_size=4 --train.micro_batch_size=1";
  // 30 samples, 2 ranks, seed 3, epoch 1, drop_last (tail drop): 15 per rank, 7 steps of 2.
  const auto ref = run_command(SANA_PYTHON " " + std::string(SANA_SOURCE_DIR) +
                               "/tests/reference/distributed_sampler.py '[[30, 2, 3, 1, 1, 1]]'" +
                               " 2>/dev/null");
  REQUIRE(ref.exit_code == 0);
  const auto expected = nlohmann::json::parse(ref.output)[0];
  for (int rank = 0; rank < 2; ++rank) {
    const auto r = run_command("{ " + base + " --world-size 2 --epoch 1 --json --rank " +
                               std::to_string(rank) + " 2>/dev/null; }");
    REQUIRE(r.exit_code == 0);
    const auto plan = nlohmann::json::parse(r.output);
    CHECK(plan["steps_per_epoch"] == 7);
    std::vector<int64_t> mine;
    for (const auto& step : plan["steps"]) {
      for (int64_t id : step) mine.push_back(id);
    }
    // The whole of torch's list but the tail that fills no step: its 15 in order, 7 steps of
    // 2 train the first 14 and only the 15th is left out.
    std::vector<int64_t> want = expected[static_cast<size_t>(rank)];
    REQUIRE(want.size() == 15);
    REQUIRE(mine.size() == 14);
    CHECK(std::equal(mine.begin(), mine.end(), want.begin()));
  }
  const auto multi = run_command(kBin + " plan --config " + kTiny +
                                 " --data.data_dir=/usr/share/backgrounds/mate --work_dir=" +
                                 dir.path("w") + " --data.sampler=distributed");
  CHECK(multi.exit_code == 2);
  CHECK(multi.output.find("needs single-resolution data") != std::string::npos);
}

TEST_CASE("model: parameters per module, FLOPs per bucket and memory per process", "[cli][model]") {
  const std::string cfg600 = std::string(SANA_SOURCE_DIR) + "/configs/Sana_600M_img512.yaml";
  const auto r = run_command(kBin + " model --config " + cfg600 + " --json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));  // after the log line
  // The memory of the config's run: CAME state is about one copy of the weights plus the
  // factored rows and columns; checkpointed activations are a small part of the full ones.
  const auto& mem = j["memory_per_process"];
  CHECK(mem["optimizer_type"] == "CAME");
  CHECK(mem["optimizer"].get<double>() > mem["weights"].get<double>());
  CHECK(mem["optimizer"].get<double>() < 1.1 * mem["weights"].get<double>());
  CHECK(mem["activations_grad_checkpointing"].get<double>() < 0.2 * mem["activations"].get<double>());
  CHECK(mem["micro_batch"] == 128);
  CHECK(j["model"] == "SanaMS_600M_P1_D28");
  const int64_t total = j["parameters"]["total"];
  CHECK(total > 550'000'000);
  CHECK(total < 650'000'000);
  int64_t sum = 0;
  for (const auto& [name, n] : j["parameters"].items()) {
    if (name != "total") sum += n.get<int64_t>();
  }
  CHECK(sum == total);
  CHECK(j["parameters"]["blocks"].get<int64_t>() > total * 9 / 10);
  // 512 px through a /32 VAE with patch 1: 16 x 16 tokens in the square bucket.
  REQUIRE(j["flops"].size() >= 1);
  CHECK(j["flops"][0]["height"] == 512);
  CHECK(j["flops"][0]["tokens"] == 256);
  CHECK(j["flops"][0]["forward"].get<double>() > 2.0 * total * 256 * 0.9);

  const auto text = run_command(kBin + " model --config " + kTiny);
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.output, Catch::Contains("SanaMS_tiny_P2_D4") && Catch::Contains("total") &&
                              Catch::Contains("32x32"));
  // A head size that does not divide the width is a config error naming the key.
  const auto bad = run_command(kBin + " model --config " + kTiny + " --model.linear_head_dim=48");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("model.linear_head_dim"));
}

TEST_CASE("model --device-memory: the largest micro-batch that fits, and how to checkpoint for it", "[cli][model]") {
  // The 600M at 512 px (global batch 128 on one process): its own estimate at each
  // suggested size is within the device, and checkpointing every block fits the most.
  const std::string cfg600 = std::string(SANA_SOURCE_DIR) + "/configs/Sana_600M_img512.yaml";
  const auto r = run_command(kBin + " model --config " + cfg600 + " --json --device-memory 24");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  const auto& s = j.at("micro_batch_suggestion");
  CHECK(s["device_memory"].get<double>() == 24.0 * (1 << 30));
  REQUIRE(s["largest"].size() == 3);
  int64_t before = 0;
  for (const auto& c : s["largest"]) {  // none, every second block, every block: each fits more
    CHECK(c["micro_batch"].get<int64_t>() >= before);
    CHECK(c["bytes"].get<double>() <= s["budget"].get<double>());
    before = c["micro_batch"].get<int64_t>();
  }
  CHECK(s["pick"]["micro_batch"] == s["largest"][2]["micro_batch"]);
  CHECK(s["largest"][2]["micro_batch"].get<int64_t>() > s["largest"][0]["micro_batch"].get<int64_t>());
  // The suggestion run as the config: the estimate of that run is what the suggestion said.
  const int64_t m = s["pick"]["micro_batch"], gc = s["pick"]["gc_step"];
  const auto again = run_command(kBin + " model --config " + cfg600 + " --json --train.micro_batch_size=" +
                                 std::to_string(m) + " --train.grad_checkpointing=" + (gc > 0 ? "true" : "false") +
                                 " --train.gc_step=" + std::to_string(std::max<int64_t>(gc, 1)));
  REQUIRE(again.exit_code == 0);
  const auto k = nlohmann::json::parse(again.output.substr(again.output.find("\n{") + 1));
  CHECK(k["memory_per_process"]["total_for_config"].get<double>() ==
        Approx(s["pick"]["bytes"].get<double>()).epsilon(1e-9));
  // In words, and nothing fits a device smaller than the state.
  const auto text = run_command(kBin + " model --config " + kTiny + " --device-memory 4");
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.output, Catch::Contains("suggested: train.micro_batch_size"));
  const auto none = run_command(kBin + " model --config " + cfg600 + " --device-memory 3");
  CHECK(none.exit_code == 0);
  CHECK_THAT(none.output, Catch::Contains("suggested: nothing fits"));
}
