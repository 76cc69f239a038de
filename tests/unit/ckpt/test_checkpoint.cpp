// Checkpoints on disk: round trip, `latest`, keep_last_n, damaged files rejected with a
// clear message and `latest` falling back, a crash at any stage of a save never leaving a
// broken `latest`, `sana-train inspect`, and Python (numpy alone) reading the weights.
#include "catch.h"
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "sana/ckpt/checkpoint.h"
#include "sana/util/hash.h"
#include "test_support.h"

using namespace sana;
namespace fs = std::filesystem;

namespace {

ckpt::Snapshot snapshot(int64_t step) {
  ckpt::Snapshot s;
  torch::manual_seed(static_cast<uint64_t>(step));
  const NamedTensors model = {{"blocks.0.attn.qkv.weight", torch::randn({6, 2})},
                              {"final_layer.linear.bias", torch::randn({3})}};
  const NamedTensors ema = {{"blocks.0.attn.qkv.weight", torch::randn({6, 2})}};
  const NamedTensors optimizer = {{"blocks.0.attn.qkv.weight/step", torch::tensor({step}, torch::kInt64)},
                                  {"blocks.0.attn.qkv.weight/exp_avg", torch::randn({6, 2})}};
  s.parts = {{"model", {nullptr, model, {}}}, {"ema", {nullptr, ema, {}}}, {"optimizer", {nullptr, optimizer, {}}},
             // an fp16 run's scaler: JSON alone, no file
             {"loss_scaler", {{{"loss_scale", 8192.0}, {"loss_scale_clean_steps", step + 7}, {"overflow_steps", 3}}, {}, {}}}};
  s.state.position.global_step = step;
  s.state.position.epoch = step / 10;
  s.state.position.step_in_epoch = step % 10;
  s.state.global_batch_size = 8;
  s.state.world_size = 3;
  s.state.model = "test";
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

TEST_CASE("checkpoints round-trip, latest names the newest, old ones are pruned", "[ckpt]") {
  sana::test::TempDir dir;
  for (int64_t step : {10, 20, 30}) ckpt::write_checkpoint(dir.path(), snapshot(step), 2);
  const auto r = ckpt::resolve_latest(dir.path());
  CHECK(r.warnings.empty());
  CHECK(fs::path(r.path).filename() == "step_00000030");
  CHECK_FALSE(fs::exists(dir.path("checkpoints/step_00000010")));  // keep_last_n 2
  CHECK(fs::exists(dir.path("checkpoints/step_00000020")));
  const auto back = ckpt::read_checkpoint(r.path);
  const auto orig = snapshot(30);
  const auto& model = *back.part("model")->tensors;
  const auto& orig_model = *orig.part("model")->tensors;
  REQUIRE(model.size() == orig_model.size());
  for (size_t i = 0; i < orig_model.size(); ++i) {
    CHECK(model[i].first == orig_model[i].first);
    CHECK(torch::equal(model[i].second, orig_model[i].second));
  }
  CHECK(torch::equal(back.part("optimizer")->tensors->at(0).second, orig.part("optimizer")->tensors->at(0).second));
  CHECK(back.state.position.global_step == 30);
  CHECK(back.state.position.epoch == 3);
  CHECK(back.state.world_size == 3);
  CHECK(back.state.checksums.size() == 3);
  const auto& scaler = back.part("loss_scaler")->json;
  CHECK(scaler.at("loss_scale") == 8192.0);
  CHECK(scaler.at("loss_scale_clean_steps") == 37);
  CHECK(scaler.at("overflow_steps") == 3);
  CHECK_FALSE(back.part("loss_scaler")->tensors);  // no loss_scaler.safetensors
  CHECK(back.part("nothing") == nullptr);
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
      ckpt::write_checkpoint(dir.path(), snapshot(6), 0, crash_at);
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

TEST_CASE("a failed save (disk full) leaves no partial folder, one left by a killed writer goes next time",
          "[ckpt]") {
  sana::test::TempDir dir;
  ckpt::write_checkpoint(dir.path(), snapshot(5), 0);
  CHECK_THROWS_WITH(ckpt::write_checkpoint(dir.path(), snapshot(6), 0, fail_at_optimizer),
                    Catch::Contains("No space left"));
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
  const auto r = sana::test::run_command(SANA_PYTHON " -c '\n"
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
  for (const auto& [name, t] : *s.part("model")->tensors) {
    std::string shape = "[";
    for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
    shape += "]";
    const auto line = r.output.find(name + " " + shape + " ");
    REQUIRE(line != std::string::npos);
    const double python_sum = std::stod(r.output.substr(line + name.size() + shape.size() + 2));
    CHECK(python_sum == Approx(t.sum().item<double>()).epsilon(1e-6));
  }
}

TEST_CASE("A checkpoint of format 1 (sana-train up to 0016840) reads into today's parts", "[ckpt]") {
  // trainer_state.json as that sana-train wrote it (2 processes, train.deterministic, 2
  // steps); its tensor files are replaced by small ones, their checksums put in its place.
  sana::test::TempDir dir;
  const fs::path ckpt_dir = dir.path("step_00000002");
  fs::create_directories(ckpt_dir);
  nlohmann::json state;
  std::ifstream(std::string(SANA_SOURCE_DIR) + "/tests/data/ckpt_format1/trainer_state.json") >> state;
  REQUIRE(state.at("format") == "sana-train checkpoint 1");
  for (const char* file : {"model.safetensors", "ema.safetensors", "optimizer.safetensors"}) {
    REQUIRE(state.at("checksums").contains(file));
    write_safetensors((ckpt_dir / file).string(), {{"w", torch::full({2}, 3.0)}});
    std::ifstream in(ckpt_dir / file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    state["checksums"][file] = hash_hex(bytes);
  }
  std::ofstream(ckpt_dir / "trainer_state.json") << state.dump(2);

  const auto snap = ckpt::read_checkpoint(ckpt_dir.string());
  CHECK(snap.state.position.global_step == 2);
  CHECK(snap.state.position.step_in_epoch == 2);
  CHECK(snap.state.world_size == 2);
  CHECK(snap.state.model == "SanaMS_tiny_P2_D4");
  CHECK(snap.state.config.at("train.deterministic") == "true");
  REQUIRE(snap.part("reducer") != nullptr);
  CHECK(snap.part("reducer")->json.at("exact_scales") == std::vector<int64_t>{48, 48});
  CHECK(snap.part("bad_samples")->json.at("samples_read") == 16);
  CHECK(snap.part("bad_samples")->json.at("bad_samples") == 0);
  CHECK(snap.part("nonfinite")->json.at("skipped_steps") == 0);
  CHECK(snap.part("loss_scaler") == nullptr);  // an fp32 run: no scale saved
  for (const char* part : {"model", "ema", "optimizer"}) {
    REQUIRE(snap.part(part) != nullptr);
    REQUIRE(snap.part(part)->tensors);
    CHECK(torch::equal(snap.part(part)->tensors->at(0).second, torch::full({2}, 3.0)));
  }
}
