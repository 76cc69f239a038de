// Checkpoints (docs/checkpoints.md): one folder per checkpoint under
// work_dir/checkpoints/step_NNNNNNNN/ with one <part>.safetensors per stateful part that
// has tensors (model, ema, optimizer keyed "<parameter>/<state>") and trainer_state.json
// (the run position and metadata, each part's JSON under "parts", and an xxh3 checksum of
// every other file), plus a `latest` file naming the newest. This module knows no part:
// it writes and reads whatever the Snapshot holds (util/stateful.h). Written into a
// temporary folder, every file fsynced, renamed into place, and
// `latest` moved last: a crash at any moment leaves the old or the new checkpoint, never a
// broken one named by `latest`. Reading verifies every checksum first.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sana/util/error.h"
#include "sana/util/safetensors.h"
#include "sana/util/stateful.h"

namespace sana::ckpt {

class CheckpointError : public sana::RunError {
 public:
  explicit CheckpointError(const std::string& what) : RunError(what, "checkpoint error") {}
};

// A checkpoint found damaged while the ranks read it (format 3: a tensor's checksum), before
// any part was restored: every rank throws it alike, and `resume_from: latest` goes on
// to the checkpoint before.
class DamagedCheckpoint : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// A part of the epoch in progress batched one way from `first_step` (the trainer's plan).
struct EpochSegment {
  int64_t first_step = 0;
  int64_t global_batch_size = 0;
  int64_t batch_tokens = 0;
};

// Where a run stands: the next step of which epoch's plan, and optimizer steps done.
struct RunPosition {
  int64_t epoch = 0;             // the epoch to continue in, from 0
  int64_t step_in_epoch = 0;     // the next step of that epoch's plan
  int64_t global_step = 0;       // optimizer steps done
  int64_t consumed_samples = 0;  // samples of all steps so far (global batches vary with batch changes)
};

// The run's position and metadata (trainer_state.json; every field is written and read in
// one place, checkpoint.cpp's fields_of); every part's own state is in Snapshot::parts.
struct TrainerState {
  RunPosition position;
  int64_t global_batch_size = 0;
  int64_t batch_tokens = 0;
  // The current epoch's plan when a resume changed the batch size in it, part by part;
  // empty: one part, global_batch_size (or batch_tokens) from step 0.
  std::vector<EpochSegment> epoch_segments;
  int64_t seed = 0;
  int64_t world_size = 0;       // at save; a resume may use any number of processes
  std::string model;
  std::string config_hash;
  std::map<std::string, std::string> config;  // every key's value (config::config_values)
  std::map<std::string, std::string> checksums;  // file name -> xxh3-64 hex
  // As read: 1, 2 (one file per part, its tensors read with it) or 3 (each rank's files and
  // index.json: read_checkpoint(dir, false) leaves the tensors to ckpt/shards.h).
  int format = 2;
};

struct Snapshot {
  TrainerState state;
  // Each stateful part's state by its name, in the order the parts were registered.
  std::vector<std::pair<std::string, PartState>> parts;
  // The part's state, or null when the checkpoint holds none.
  const PartState* part(const std::string& name) const;
};

std::string checkpoint_name(int64_t global_step);  // step_00001200
// The sana-train checkpoint folder `path` is or lies in (a folder with trainer_state.json,
// or a file directly in one, such as its model.safetensors), or "" when it is neither.
std::string checkpoint_folder_of(const std::string& path);

// Called with the name of each step of a checkpoint's write and commit before it begins (a
// part's file, "index.json", "trainer_state.json", "rename", "latest"); empty: none. Fault
// injection passes one in (train/test_hooks.h: a delay so that a fault can strike mid-save;
// tests: a throw, as a crash there), so no global is set.
using StageHook = std::function<void(const char* stage)>;

// Writes the checkpoint (format 2: one file per part) atomically and points `latest` at
// it; then deletes all but the newest keep_last_n (0 keeps all). Returns the folder.
// Format 3, every rank writing its own share, is ckpt/shards.h.
std::string write_checkpoint(const std::string& work_dir, Snapshot snapshot, int64_t keep_last_n,
                             const StageHook& before_stage = {});

// Verifies the folder (trainer_state.json readable, every file present with its checksum;
// format 3: index.json's checksum and every shard file whole, the tensors' checksums being
// checked as they are read) and returns the state; throws CheckpointError saying what is wrong.
TrainerState verify_checkpoint(const std::string& dir);
// verify_checkpoint, then every tensor (format 3: gathered from every rank's files, each
// checked). `tensors` false (format 3 only): the parts' JSON, and an empty tensor list for
// each part that has tensors (ckpt/shards.h reads them).
Snapshot read_checkpoint(const std::string& dir, bool tensors = true);
// trainer_state.json's text (folder.h: trainer_state_text) as a snapshot: the run's state
// and each part's JSON, no tensors.
Snapshot snapshot_of_state_text(const std::string& text);
// One part's tensors of the checkpoint folder `dir` (verified as read_checkpoint() does,
// any format), or nothing when the checkpoint holds no tensors of that part.
std::optional<NamedTensors> read_part_tensors(const std::string& dir, const std::string& part);

// `latest` in work_dir: the checkpoint it names if valid, else the newest valid one;
// `warnings` says what was skipped and why. `path` is empty when none is valid. Folders
// in `skip` (found damaged already) are passed over.
struct Resolved {
  std::string path;
  std::vector<std::string> warnings;
};
Resolved resolve_latest(const std::string& work_dir, const std::vector<std::string>& skip = {});


// Writes snapshots on a background thread, one at a time: save() waits for the previous
// write first; wait() waits for the current one. A failed write is rethrown by the next
// save() or wait().
class AsyncSaver {
 public:
  AsyncSaver() = default;
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;
  void save(const std::string& work_dir, Snapshot snapshot, int64_t keep_last_n, StageHook before_stage = {});
  // Any write: `job` runs on the thread and returns the folder it wrote ("" for none).
  void run(std::function<std::string()> job);
  void wait();
  // The last write's duration and folder: written by the writing thread, so read them only
  // after wait() (or save(), which waits first) has returned.
  double last_write_seconds() const { return last_seconds_; }
  std::string last_path() const { return last_path_; }

 private:
  std::thread thread_;
  std::exception_ptr error_;
  double last_seconds_ = 0;
  std::string last_path_;
};

}  // namespace sana::ckpt
