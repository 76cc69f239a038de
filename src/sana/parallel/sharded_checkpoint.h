// Checkpoint format 3 from the run's side (ckpt.format 3, docs/checkpoints.md): every rank
// writes its share at once and reads back only what it keeps. Who owns an entry comes from
// the shard plan (parallel/zero.h: Zero::owner_of, at every stage, so writing is parallel at
// stage 0 too); this rank's share is copied on the main thread with no collective, written
// on the saver's thread, and rank 0 commits the folder once every rank has said what it
// wrote (through the store, dist/background_gather.h). On resume, at any world size and
// stage, each entry is read by the rank that owns it now; an entry every rank restores
// (the model, and everything at stage 0) is then broadcast from its reader.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sana/ckpt/checkpoint.h"
#include "sana/distributed/background_gather.h"
#include "sana/distributed/runtime.h"
#include "sana/util/stateful.h"

namespace sana::parallel {

// Where a checkpoint's entries go: the rank that writes and reads each, and its place in
// its part (Zero::owner_of, Zero::order_of).
struct ShardRoles {
  std::function<int(const std::string&)> owner_of;
  std::function<int64_t(const std::string&)> order_of;
};

class ShardedCheckpoints {
 public:
  // A collective (rank 0 names the temporary folders). `timeout_s`: how long rank 0's
  // commit waits for the slowest rank's write after its own (dist.timeout_s).
  ShardedCheckpoints(dist::Runtime& rt, ShardRoles roles, double timeout_s);

  // Every rank, on the main thread: this rank's share of every part copied (no collective)
  // and the job that writes the checkpoint of global step `step`, to run on the saver's
  // thread. `run` is the run's state on rank 0 (which commits), nothing elsewhere;
  // `before_stage` is called before each stage of the write and commit (fault injection).
  std::function<std::string()> save_job(const std::vector<Stateful*>& parts, int64_t step,
                                        std::optional<ckpt::TrainerState> run, const std::string& work_dir,
                                        int64_t keep_last_n, ckpt::StageHook before_stage = {});
  // Every rank (a collective): fills `snapshot` (read_checkpoint(dir, false)) with the
  // tensors each part restores on this rank.
  void load(ckpt::Snapshot& snapshot, const std::string& dir, const std::vector<Stateful*>& parts);

 private:
  dist::Runtime& rt_;
  ShardRoles roles_;
  std::string token_;
  std::shared_ptr<dist::BackgroundGather> gather_;
};

}  // namespace sana::parallel
