// When and how the training loop saves: the save policy (train.save_model_steps,
// train.save_model_epochs, a stop request, the end of training), the registered stateful
// parts a checkpoint holds, and their background write: every rank its own share
// (ckpt.format 3, parallel/sharded_checkpoint.h), or rank 0 the whole (format 2). The loop
// only says where it is; it never holds save policy. A checkpoint is the run's state (the
// caller's) plus every registered part's state; restore() is its inverse.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sana/ckpt/checkpoint.h"
#include "sana/parallel/sharded_checkpoint.h"
#include "sana/train/checkpoint/run_state.h"
#include "sana/util/stateful.h"

namespace sana::train {


// When and where checkpoints are written: the keys by their names (train/options/torch_options.h
// fills them from the config).
struct CheckpointOptions {
  std::string work_dir;           // checkpoints go to work_dir/checkpoints
  int64_t save_model_steps = 0;   // train.save_model_steps (0: never by steps)
  int64_t save_model_epochs = 0;  // train.save_model_epochs (0: never by epochs)
  int64_t keep_last_n = 0;        // ckpt.keep_last_n (0: all)
  bool async_save = true;         // ckpt.async_save: written in the background
  // Called before each stage of every write (fault injection; empty in production runs).
  ckpt::StageHook before_stage;
};

// Why a checkpoint is due after the step that made `global_step` steps (ending epoch
// `epoch`, from 0, when `epoch_end`), or "" when none is.
std::string save_reason(const CheckpointOptions& o, int64_t global_step, int64_t total_steps, bool epoch_end,
                        int64_t epoch, bool stop_requested);

class Checkpointer {
 public:
  // Format 2: only the writing rank (rank 0) captures and writes; every rank follows the
  // policy.
  Checkpointer(CheckpointOptions options, bool writes);
  // Format-3 checkpoints are read as `sharded` says (every rank its share), whatever this
  // run writes; `write` (ckpt.format 3): this run writes its checkpoints so too.
  void use_shards(std::unique_ptr<parallel::ShardedCheckpoints> sharded, bool write) {
    sharded_ = std::move(sharded);
    writes_shards_ = write;
  }

  // dist.elastic continue, after a regroup: the write in flight ends (one that needed the
  // lost rank is abandoned, with a warning) and format-3 checkpoints go by `sharded`, the
  // new group's.
  void regroup(std::unique_ptr<parallel::ShardedCheckpoints> sharded);

  // Adds a part whose state every checkpoint holds, under its state_name() (unique;
  // lower-case letters, digits and '_': it names a file). The part must outlive the
  // Checkpointer.
  void add(Stateful& part);
  // The run's state plus every part's, in the order they were added (this rank's own).
  ckpt::Snapshot capture(ckpt::TrainerState run) const;
  const std::vector<Stateful*>& parts() const { return parts_; }
  // Every rank: each part's gather_state(); the snapshot on the writing rank (run_state()
  // runs there only), nothing elsewhere.
  std::optional<ckpt::Snapshot> gather(const std::function<ckpt::TrainerState()>& run_state) const;
  // Hands every part its saved state (null for a part the checkpoint does not hold). A
  // format-3 snapshot (read_checkpoint(dir, false)) gets its tensors first: each rank reads
  // what it keeps (a collective).
  void restore(ckpt::Snapshot& snapshot, const std::string& source) const;
  // restore() of the named parts alone (the others keep their state).
  void restore_parts(ckpt::Snapshot& snapshot, const std::string& source, const std::vector<std::string>& names) const;

  // After each step: `next` is where a resume continues. Saves when save_reason() says so
  // and this step was not saved yet; run_state() runs only on the writing rank.
  void maybe_save(const RunPosition& next, int64_t total_steps, bool epoch_end, int64_t epoch, bool stop_requested,
                  const std::function<ckpt::TrainerState()>& run_state);
  // Saves now (once per step) for the given reason.
  void save(const RunPosition& next, const std::string& why, const std::function<ckpt::TrainerState()>& run_state);
  // Waits for the background write (rethrowing its failure) and names the last checkpoint.
  void finish();

 private:
  void restore_of(ckpt::Snapshot& snapshot, const std::string& source, const std::vector<Stateful*>& parts) const;
  void log_save(const RunPosition& next, const std::string& why, std::chrono::steady_clock::time_point start,
                double previous);

  CheckpointOptions o_;
  bool writes_;
  std::vector<Stateful*> parts_;
  std::unique_ptr<parallel::ShardedCheckpoints> sharded_;  // format 3; outlives the saver's thread
  bool writes_shards_ = false;
  ckpt::AsyncSaver saver_;
  int64_t last_saved_ = -1;
};

}  // namespace sana::train
