// The real sana-train binary: help, --print-config, overrides and exit codes.
#include <catch2/catch.hpp>

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

TEST_CASE("list-keys lists every key with its type and default", "[cli]") {
  const auto r = run_command(kBin + " --list-keys");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("train.optimizer.betas") != std::string::npos);
  CHECK(r.output.find("dist.timeout_s") != std::string::npos);
  CHECK(r.output.find("[AdamW|CAME]") != std::string::npos);
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
  SECTION("a launcher environment that does not fit the batch sizes") {
    const auto r = run_command("RANK=0 WORLD_SIZE=3 " + kBin + " --config " + kTiny);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("world size must be one of: 1, 2") != std::string::npos);
  }
  SECTION("a broken launcher environment names the variable") {
    const auto r = run_command("env -u WORLD_SIZE RANK=0 " + kBin + " --config " + kTiny);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("WORLD_SIZE is not set") != std::string::npos);
  }
}
