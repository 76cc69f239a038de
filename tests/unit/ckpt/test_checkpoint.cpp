// Checkpoints on disk: round trip, `latest`, keep_last_n, damaged files rejected with a
// clear message and `latest` falling back, a crash at any stage of a save never leaving a
// broken `latest`, `sana-train inspect`, and Python (numpy alone) reading the weights.
#include "catch.h"
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "sana/ckpt/checkpoint.h"
#include "test_support.h"

using namespace sana;
namespace fs = std::filesystem;

namespace {

ckpt::Snapshot snapshot(int64_t step) {
  ckpt::Snapshot s;
  torch::manual_seed(static_cast<uint64_t>(step));
  s.model = {{"blocks.0.attn.qkv.weight", torch::randn({6, 2})}, {"final_layer.linear.bias", torch::randn({3})}};
  s.ema = {{"blocks.0.attn.qkv.weight", torch::randn({6, 2})}};
  s.optimizer = {{"blocks.0.attn.qkv.weight/step", torch::tensor({step}, torch::kInt64)},
                 {"blocks.0.attn.qkv.weight/exp_avg", torch::randn({6, 2})}};
  s.state.global_step = step;
  s.state.epoch = step / 10;
  s.state.step_in_epoch = step % 10;
  s.state.global_batch_size = 8;
  s.state.world_size = 3;
  s.state.model = "test";
  s.state.loss_scale = 8192.0;  // an fp16 run's scaler
  s.state.loss_scale_clean_steps = step + 7;
  s.state.overflow_steps = 3;
  return s;
}

void flip_byte(const fs::path& p, std::streamoff at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("checkpoints round-trip; latest names the newest; old ones are pruned", "[ckpt]") {
  sana::test::TempDir dir;
  for (int64_t step : {10, 20, 30}) ckpt::write_checkpoint(dir.path(), snapshot(step), 2);
  const auto r = ckpt::resolve_latest(dir.path());
  CHECK(r.warnings.empty());
  CHECK(fs::path(r.path).filename() == "step_00000030");
  CHECK_FALSE(fs::exists(dir.path("checkpoints/step_00000010")));  // keep_last_n 2
  CHECK(fs::exists(dir.path("checkpoints/step_00000020")));
  const auto back = ckpt::read_checkpoint(r.path);
  const auto orig = snapshot(30);
  REQUIRE(back.model.size() == orig.model.size());
  for (size_t i = 0; i < orig.model.size(); ++i) {
    CHECK(back.model[i].first == orig.model[i].first);
    CHECK(torch::equal(back.model[i].second, orig.model[i].second));
  }
  CHECK(torch::equal(back.optimizer[0].second, orig.optimizer[0].second));
  CHECK(back.state.global_step == 30);
  CHECK(back.state.epoch == 3);
  CHECK(back.state.world_size == 3);
  CHECK(back.state.checksums.size() == 3);
  CHECK(back.state.loss_scale == 8192.0);
  CHECK(back.state.loss_scale_clean_steps == 37);
  CHECK(back.state.overflow_steps == 3);
}

TEST_CASE("damaged checkpoints are rejected by name and latest falls back", "[ckpt]") {
  sana::test::TempDir dir;
  ckpt::write_checkpoint(dir.path(), snapshot(1), 0);
  ckpt::write_checkpoint(dir.path(), snapshot(2), 0);
  const fs::path newest = dir.path("checkpoints/step_00000002");
  SECTION("flipped bytes") {
    flip_byte(newest / "model.safetensors", 200);
    CHECK_THROWS_WITH(ckpt::verify_checkpoint(newest.string()), Catch::Contains("model.safetensors is damaged (checksum"));
  }
  SECTION("a truncated file") {
    fs::resize_file(newest / "optimizer.safetensors", 40);
    CHECK_THROWS_WITH(ckpt::verify_checkpoint(newest.string()), Catch::Contains("optimizer.safetensors is damaged"));
  }
  SECTION("a missing file") {
    fs::remove(newest / "ema.safetensors");
    CHECK_THROWS_WITH(ckpt::verify_checkpoint(newest.string()), Catch::Contains("ema.safetensors is missing"));
  }
  SECTION("a damaged state file") {
    std::ofstream(newest / "trainer_state.json") << "{\"epoch\": ";
    CHECK_THROWS_WITH(ckpt::verify_checkpoint(newest.string()), Catch::Contains("trainer_state.json' is damaged"));
  }
  const auto r = ckpt::resolve_latest(dir.path());
  CHECK(fs::path(r.path).filename() == "step_00000001");
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Catch::Contains("skipping step_00000002"));
  // inspect: the damaged one fails, the work_dir resolves to the good one.
  const std::string bin = SANA_TRAIN_BIN;
  CHECK(sana::test::run_command(bin + " inspect " + newest.string()).exit_code == 1);
  const auto ok = sana::test::run_command(bin + " inspect " + dir.path());
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("step_00000001") && Catch::Contains("all 3 files verified") &&
                            Catch::Contains("warning: skipping step_00000002"));
}

namespace {
const char* g_crash_stage = nullptr;
void crash_at(const char* stage) {
  if (std::string(stage) == g_crash_stage) _exit(9);  // as abrupt as kill -9: no cleanup
}
}  // namespace

TEST_CASE("a crash at any stage of a save leaves latest on a loadable checkpoint", "[ckpt]") {
  for (const char* stage : {"model.safetensors", "ema.safetensors", "optimizer.safetensors", "trainer_state.json",
                            "rename", "latest"}) {
    sana::test::TempDir dir;
    ckpt::write_checkpoint(dir.path(), snapshot(5), 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      g_crash_stage = stage;
      ckpt::checkpoint_test_hook = crash_at;
      ckpt::write_checkpoint(dir.path(), snapshot(6), 0);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    INFO("crash before " << stage);
    CHECK(WEXITSTATUS(status) == 9);
    const auto r = ckpt::resolve_latest(dir.path());
    REQUIRE_FALSE(r.path.empty());
    // `latest` moves last: until then it names the old checkpoint, which is intact.
    CHECK(fs::path(r.path).filename() == "step_00000005");
    CHECK(r.warnings.empty());
    CHECK_NOTHROW(ckpt::read_checkpoint(r.path));
  }
}

namespace {
void fail_at_optimizer(const char* stage) {
  if (std::string(stage) == "optimizer.safetensors") throw std::runtime_error("No space left on device");
}
}  // namespace

TEST_CASE("a failed save (disk full) leaves no partial folder; one left by a killed writer goes next time",
          "[ckpt]") {
  sana::test::TempDir dir;
  ckpt::write_checkpoint(dir.path(), snapshot(5), 0);
  ckpt::checkpoint_test_hook = fail_at_optimizer;
  CHECK_THROWS_WITH(ckpt::write_checkpoint(dir.path(), snapshot(6), 0), Catch::Contains("No space left"));
  ckpt::checkpoint_test_hook = nullptr;
  const auto leftovers = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir.path("checkpoints"))) {
      if (e.path().filename().string().rfind(".tmp-", 0) == 0) ++n;
    }
    return n;
  };
  CHECK(leftovers() == 0);  // the space it took is free again
  CHECK(fs::path(ckpt::resolve_latest(dir.path()).path).filename() == "step_00000005");
  // A writer killed mid-save (a pid that no longer runs) left its folder: the next save clears it.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  fs::create_directories(dir.path("checkpoints/.tmp-step_00000006-" + std::to_string(child)));
  REQUIRE(leftovers() == 1);
  ckpt::write_checkpoint(dir.path(), snapshot(7), 0);
  CHECK(leftovers() == 0);
}

TEST_CASE("Python reads the model weights with numpy alone", "[ckpt]") {
  sana::test::TempDir dir;
  const auto path = ckpt::write_checkpoint(dir.path(), snapshot(3), 0);
  const auto r = sana::test::run_command("/usr/bin/python3 -c '\n"
                                         "import json, struct, sys, numpy as np\n"
                                         "b = open(sys.argv[1], \"rb\").read(); n = struct.unpack(\"<Q\", b[:8])[0]\n"
                                         "h = json.loads(b[8:8 + n]); h.pop(\"__metadata__\", None)\n"
                                         "for k, v in h.items():\n"
                                         "    a = np.frombuffer(b[8 + n + v[\"data_offsets\"][0]:8 + n + v[\"data_offsets\"][1]], np.float32).reshape(v[\"shape\"])\n"
                                         "    print(k, list(a.shape), repr(float(a.sum())))\n"
                                         "' " + path + "/model.safetensors");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto s = snapshot(3);
  for (const auto& [name, t] : s.model) {
    std::string shape = "[";
    for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
    shape += "]";
    const auto line = r.output.find(name + " " + shape + " ");
    REQUIRE(line != std::string::npos);
    const double python_sum = std::stod(r.output.substr(line + name.size() + shape.size() + 2));
    CHECK(python_sum == Approx(t.sum().item<double>()).epsilon(1e-6));
  }
}
