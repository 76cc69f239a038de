#include "sana/parallel/sharded_checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <utility>

#include "sana/ckpt/shards.h"
#include "sana/distributed/tensor_stream.h"
#include "sana/util/log.h"

namespace sana::parallel {

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int64_t tensor_bytes(const NamedTensors& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace

ShardedCheckpoints::ShardedCheckpoints(dist::Runtime& rt, ShardRoles roles, double timeout_s)
    : rt_(rt),
      roles_(std::move(roles)),
      token_(rt.broadcast_string(std::to_string(::getpid()))),  // collective
      gather_(std::make_shared<dist::BackgroundGather>(
          rt.endpoint(), rt.rank(), rt.world_size(), std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
          rt.members())) {}

std::function<std::string()> ShardedCheckpoints::save_job(const std::vector<Stateful*>& parts,
                                                           int64_t step, std::optional<ckpt::TrainerState> run,
                                                           const std::string& work_dir, int64_t keep_last_n,
                                                           ckpt::StageHook before_stage) {
  const int rank = rt_.rank(), world = rt_.world_size();
  const int64_t moved_before = rt_.tensor_bytes();
  std::vector<std::pair<std::string, PartState>> mine;
  const auto keep = [&](const std::string& entry) { return roles_.owner_of(entry) == rank; };
  int64_t bytes = 0;
  auto part_json = nlohmann::json::object();
  for (const auto* p : parts) {
    mine.emplace_back(p->state_name(), p->save_state_of(keep));
    if (mine.back().second.tensors) bytes += tensor_bytes(*mine.back().second.tensors);
    if (!mine.back().second.json.is_null()) part_json[p->state_name()] = mine.back().second.json;
  }
  const std::string name = ckpt::checkpoint_name(step);
  log::info("checkpoint {}: rank {} writes {} bytes ({:.2f} MiB) of it; {} bytes passed between ranks to make it",
            name, rank, bytes, mib(bytes), rt_.tensor_bytes() - moved_before);
  const std::string dir = ckpt::shard_temporary_folder(work_dir, step, token_);
  auto order_of = roles_.order_of;
  auto gather = gather_;
  auto share = std::make_shared<std::vector<std::pair<std::string, PartState>>>(std::move(mine));
  auto state = std::make_shared<std::optional<ckpt::TrainerState>>(std::move(run));
  return [=]() -> std::string {
    ckpt::RankShards written;
    try {
      written = ckpt::write_rank_shards(dir, *share, rank, world,
                                        [&](const std::string&, const std::string& entry) { return order_of(entry); },
                                        before_stage);
    } catch (const std::exception& e) {
      written = {};
      written.rank = rank;
      written.error = e.what();
    }
    share->clear();  // the host copies go as soon as they are on disk
    std::vector<std::string> all;
    try {
      all = gather->gather("checkpoint " + name, written.to_json().dump());
    } catch (...) {
      if (rank == 0) std::filesystem::remove_all(dir);
      throw;
    }
    if (rank != 0) {
      if (!written.error.empty()) throw ckpt::CheckpointError(written.error);
      return "";
    }
    // Rank 0 commits, or fails naming the rank whose write failed (its own included) after
    // removing the temporary folder.
    std::vector<ckpt::RankShards> ranks;
    for (const auto& text : all) ranks.push_back(ckpt::RankShards::from_json(nlohmann::json::parse(text)));
    return ckpt::commit_shards(work_dir, dir, **state, part_json, ranks, keep_last_n, before_stage);
  };
}

void ShardedCheckpoints::load(ckpt::Snapshot& snapshot, const std::string& dir, const std::vector<Stateful*>& parts) {
  const int rank = rt_.rank(), world = rt_.world_size();
  const auto index = ckpt::read_shard_index(dir);
  const int64_t moved_before = rt_.tensor_bytes();
  int64_t read = 0, received = 0, total = 0;
  for (const auto& [part, entries] : index.parts) {
    for (const auto& e : entries) total += e.bytes;
  }
  // Each part's entries by reader (the rank that owns each now), and what this rank read:
  // every rank reads its own first, and all agree that every read was whole before anything
  // moves or is restored, so a damaged tensor fails every rank alike.
  struct Plan {
    const Stateful* part;
    const std::vector<ckpt::ShardEntry>* entries;
    std::vector<std::vector<const ckpt::ShardEntry*>> by_reader;
    NamedTensors own;
  };
  std::vector<Plan> plans;
  std::string error;
  for (const auto* p : parts) {
    const auto found = index.parts.find(p->state_name());
    if (found == index.parts.end()) continue;
    Plan plan{p, &found->second, std::vector<std::vector<const ckpt::ShardEntry*>>(static_cast<size_t>(world)), {}};
    for (const auto& e : found->second) plan.by_reader[static_cast<size_t>(roles_.owner_of(e.name))].push_back(&e);
    if (error.empty()) {
      try {
        plan.own = ckpt::read_shard_entries(dir, plan.by_reader[static_cast<size_t>(rank)], &read);
      } catch (const ckpt::CheckpointError& e) {
        error = e.what();
      }
    }
    plans.push_back(std::move(plan));
  }
  const auto errors = rt_.all_gather("checkpoint read " + dir, error);  // collective
  for (int r = 0; r < world; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      throw ckpt::DamagedCheckpoint(fmt::format("rank {} read: {}", r, errors[static_cast<size_t>(r)]));
    }
  }
  for (auto& plan : plans) {
    PartState* target = nullptr;
    for (auto& [n, state] : snapshot.parts) {
      if (n == plan.part->state_name()) target = &state;
    }
    if (target == nullptr) target = &snapshot.parts.emplace_back(plan.part->state_name(), PartState{}).second;
    if (plan.part->restores_share()) {  // only this rank's share: nothing to pass on
      target->tensors = std::move(plan.own);
      continue;
    }
    // Every rank restores every entry: each reader's go to all, in index order.
    std::map<std::string, torch::Tensor> by_name;
    for (auto& [n, t] : plan.own) by_name.emplace(n, t);
    for (int r = 0; r < world; ++r) {
      std::vector<torch::Tensor> stream;
      int64_t bytes = 0;
      for (const auto* e : plan.by_reader[static_cast<size_t>(r)]) {
        bytes += e->bytes;
        if (r != rank) {
          auto t = torch::empty(e->shape, torch::TensorOptions().dtype(safetensors_scalar_type(e->dtype)));
          by_name.emplace(e->name, t);
        }
        stream.push_back(by_name.at(e->name));
      }
      dist::broadcast_tensors(rt_, r, bytes, stream);  // collective
      if (r != rank) received += bytes;
    }
    NamedTensors all;
    for (const auto& e : *plan.entries) all.emplace_back(e.name, by_name.at(e.name));
    target->tensors = std::move(all);
  }
  log::info("resume: rank {} read {} bytes ({:.2f} MiB) of the checkpoint's {} ({:.2f} MiB, written by {} rank{}) "
            "and received {} bytes ({:.2f} MiB) from other ranks; {} bytes passed between ranks",
            rank, read, mib(read), total, mib(total), index.world, index.world == 1 ? "" : "s", received,
            mib(received), rt_.tensor_bytes() - moved_before);
}

}  // namespace sana::parallel
