// Checkpoint format 3 on disk, with three "ranks" in one process: each writes only its own
// entries to its own files; rank 0's commit merges what they wrote into index.json; the
// whole reads back in each part's order, any entry alone with one ranged read; a damaged
// tensor, a truncated file or a rank whose write failed are refused with the file, tensor
// or rank named; a crash at any stage leaves `latest` on the previous checkpoint.
#include "catch.h"
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "sana/ckpt/checkpoint.h"
#include "sana/ckpt/shards.h"
#include "test_support.h"

using namespace sana;
namespace fs = std::filesystem;

namespace format3 {

constexpr int kWorld = 3;

// The whole checkpoint as stage 0 would hold it: parameter p<k> has order k; "pos_embed" is
// a buffer (no parameter: order 99, rank 0's).
struct Whole {
  NamedTensors model, optimizer;
  Whole() {
    torch::manual_seed(7);
    for (int k = 0; k < 5; ++k) {
      model.emplace_back("p" + std::to_string(k), torch::randn({k + 2, 3}));
      optimizer.emplace_back("p" + std::to_string(k) + "/step", torch::tensor({int64_t{k}}, torch::kInt64));
      optimizer.emplace_back("p" + std::to_string(k) + "/exp_avg", torch::randn({k + 2, 3}));
    }
    model.emplace_back("pos_embed", torch::randn({4, 3}));
  }
};

int64_t order_of(const std::string& entry) {
  return entry[0] == 'p' && entry[1] != 'o' ? std::stoll(entry.substr(1, entry.find('/') - 1)) : 99;
}

// The owner of each parameter: not in registration order, as ZeRO's buckets run backwards.
int owner_of(const std::string& entry) {
  const int64_t k = order_of(entry);
  return k == 99 ? 0 : static_cast<int>((4 - k) * kWorld / 5);
}

std::vector<std::pair<std::string, PartState>> share_of(const Whole& w, int rank) {
  NamedTensors model, optimizer;
  for (const auto& e : w.model) {
    if (owner_of(e.first) == rank) model.push_back(e);
  }
  for (const auto& e : w.optimizer) {
    if (owner_of(e.first) == rank) optimizer.push_back(e);
  }
  PartState scaler;
  scaler.json = {{"loss_scale", 1024.0}};
  return {{"model", {nullptr, model, {}}}, {"optimizer", {nullptr, optimizer, {}}}, {"loss_scaler", scaler}};
}

ckpt::TrainerState state_at(int64_t step) {
  ckpt::TrainerState s;
  s.position.global_step = step;
  s.global_batch_size = 6;
  s.world_size = kWorld;
  s.model = "test";
  return s;
}

// Every rank writes its share, then rank 0 commits; `fail_rank` reports an error instead.
// `before_stage` is passed to every write and the commit.
std::string save(const std::string& work_dir, int64_t step, int fail_rank = -1, const ckpt::StageHook& before_stage = {}) {
  const Whole w;
  const std::string dir = ckpt::shard_temporary_folder(work_dir, step, std::to_string(::getpid()));
  std::vector<ckpt::RankShards> ranks;
  for (int r = 0; r < kWorld; ++r) {
    if (r == fail_rank) {
      ranks.push_back({r, "No space left on device", {}, {}});
      continue;
    }
    ranks.push_back(ckpt::write_rank_shards(dir, share_of(w, r), r, kWorld,
                                            [](const std::string&, const std::string& e) { return order_of(e); },
                                            before_stage));
    // What travels through the store survives the trip.
    ranks.back() = ckpt::RankShards::from_json(nlohmann::json::parse(ranks.back().to_json().dump()));
  }
  return ckpt::commit_shards(work_dir, dir, state_at(step), {{"loss_scaler", {{"loss_scale", 1024.0}}}}, ranks, 0,
                             before_stage);
}

bool equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].first != b[k].first || !torch::equal(a[k].second, b[k].second)) return false;
  }
  return true;
}

}  // namespace format3

TEST_CASE("format 3: each rank's file holds its entries, the whole reads back in order", "[ckpt]") {
  sana::test::TempDir work;
  const auto path = format3::save(work.path(), 4);
  CHECK(fs::path(path).filename() == "step_00000004");
  const format3::Whole w;
  for (int r = 0; r < format3::kWorld; ++r) {
    const auto file = read_safetensors((fs::path(path) / ckpt::shard_file_name("model", r, format3::kWorld)).string());
    for (const auto& [name, t] : file.tensors) CHECK(format3::owner_of(name) == r);
    CHECK(file.tensors.size() == format3::share_of(w, r)[0].second.tensors->size());
  }
  const auto state = ckpt::verify_checkpoint(path);
  CHECK(state.format == 3);
  const auto snap = ckpt::read_checkpoint(path);
  REQUIRE(snap.part("model") != nullptr);
  CHECK(format3::equal(*snap.part("model")->tensors, w.model));          // registration order, buffer last
  CHECK(format3::equal(*snap.part("optimizer")->tensors, w.optimizer));  // states in each rank's order
  CHECK(snap.part("loss_scaler")->json.at("loss_scale") == 1024.0);
  CHECK_FALSE(snap.part("loss_scaler")->tensors);
  // Without tensors: the parts are there, empty, for the caller to fill.
  const auto hollow = ckpt::read_checkpoint(path, /*tensors=*/false);
  CHECK(hollow.part("model")->tensors->empty());
}

TEST_CASE("format 3: one entry is one ranged read, checked by its checksum", "[ckpt]") {
  sana::test::TempDir work;
  const auto path = format3::save(work.path(), 4);
  const auto index = ckpt::read_shard_index(path);
  CHECK(index.world == format3::kWorld);
  const auto& entries = index.parts.at("optimizer");
  const ckpt::ShardEntry* p3 = nullptr;
  for (const auto& e : entries) {
    if (e.name == "p3/exp_avg") p3 = &e;
  }
  REQUIRE(p3 != nullptr);
  int64_t read = 0;
  const auto got = ckpt::read_shard_entries(path, {p3}, &read);
  CHECK(read == 5 * 3 * 4);  // that tensor's bytes and no more
  CHECK(torch::equal(got.at(0).second, format3::Whole().optimizer[7].second));

  // One bit flipped inside that tensor: its read names the file and the tensor; the
  // folder still verifies (sizes), as a checksum is checked by whoever reads the entry.
  {
    std::fstream f(fs::path(path) / p3->file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(p3->offset + 5);
    f.put('\x7f');
  }
  CHECK_NOTHROW(ckpt::verify_checkpoint(path));
  CHECK_THROWS_WITH(ckpt::read_shard_entries(path, {p3}),
                    Catch::Contains(p3->file + " is damaged: tensor 'p3/exp_avg' has checksum"));
  CHECK_THROWS_WITH(ckpt::read_checkpoint(path), Catch::Contains("is damaged: tensor 'p3/exp_avg'"));
}

TEST_CASE("format 3: a truncated or missing shard file fails verification and latest falls back", "[ckpt]") {
  sana::test::TempDir work;
  format3::save(work.path(), 4);
  const auto newer = format3::save(work.path(), 8);
  const auto file = fs::path(newer) / ckpt::shard_file_name("model", 1, format3::kWorld);
  fs::resize_file(file, fs::file_size(file) - 8);
  CHECK_THROWS_WITH(ckpt::verify_checkpoint(newer), Catch::Contains("model-00002-of-00003.safetensors is damaged"));
  const auto r = ckpt::resolve_latest(work.path());
  CHECK(fs::path(r.path).filename() == "step_00000004");
  REQUIRE(r.warnings.size() == 1);
  fs::remove(file);
  CHECK_THROWS_WITH(ckpt::verify_checkpoint(newer), Catch::Contains("model-00002-of-00003.safetensors is missing"));
}

TEST_CASE("format 3: a rank whose write failed fails the commit, naming it, and nothing is left", "[ckpt]") {
  sana::test::TempDir work;
  format3::save(work.path(), 4);
  CHECK_THROWS_WITH(format3::save(work.path(), 8, /*fail_rank=*/2),
                    Catch::Contains("rank 2 could not write its share of step_00000008: No space left"));
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(fs::path(work.path()) / "checkpoints")) {
    ++entries;
    CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
  CHECK(entries == 2);  // step_00000004 and latest
  CHECK(fs::path(ckpt::resolve_latest(work.path()).path).filename() == "step_00000004");
}

TEST_CASE("format 3: a rank's file rank 0 cannot see fails the commit (a work_dir not shared)", "[ckpt]") {
  sana::test::TempDir work;
  const format3::Whole w;
  const std::string dir = ckpt::shard_temporary_folder(work.path(), 4, "1");
  std::vector<ckpt::RankShards> ranks;
  for (int r = 0; r < format3::kWorld; ++r) {
    ranks.push_back(ckpt::write_rank_shards(dir, format3::share_of(w, r), r, format3::kWorld,
                                            [](const std::string&, const std::string& e) { return format3::order_of(e); }));
  }
  // Rank 2 wrote its files on a disk of its own: rank 0's folder lacks them.
  fs::remove(fs::path(dir) / ckpt::shard_file_name("optimizer", 2, format3::kWorld));
  CHECK_THROWS_WITH(ckpt::commit_shards(work.path(), dir, format3::state_at(4), nlohmann::json::object(), ranks, 0),
                    Catch::Contains("rank 2 wrote optimizer-00003-of-00003.safetensors") &&
                        Catch::Contains("but rank 0 finds no such file there: every rank must see the same work_dir"));
  CHECK_FALSE(fs::exists(dir));
  CHECK(ckpt::resolve_latest(work.path()).path.empty());
}

namespace format3 {
const char* g_stage = nullptr;
void crash_at(const char* stage) {
  if (std::string(stage) == g_stage) _exit(9);  // as abrupt as kill -9
}
}  // namespace format3

TEST_CASE("format 3: a crash at any stage of a save leaves latest on the previous checkpoint", "[ckpt]") {
  for (const char* stage : {"model-00002-of-00003.safetensors", "optimizer-00003-of-00003.safetensors", "index.json",
                            "trainer_state.json", "rename", "latest"}) {
    sana::test::TempDir work;
    format3::save(work.path(), 4);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      format3::g_stage = stage;
      format3::save(work.path(), 8, -1, format3::crash_at);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    INFO("crash before " << stage);
    CHECK(WEXITSTATUS(status) == 9);
    const auto r = ckpt::resolve_latest(work.path());
    CHECK(fs::path(r.path).filename() == "step_00000004");
    CHECK_NOTHROW(ckpt::read_checkpoint(r.path));
  }
}
