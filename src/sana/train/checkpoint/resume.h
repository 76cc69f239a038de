// Where a resumed run starts: rank 0 resolves `resume_from` (latest or a path) and every
// rank loads the checkpoint it chose; a checkpoint that cannot continue this run's sample
// stream is refused before anything is loaded.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sana/ckpt/checkpoint.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// What a resume needs to know of the run (train/options/torch_options.h fills it).
struct ResumeOptions {
  std::string resume_from;  // resume_from: "latest", a checkpoint folder, or "" (start fresh)
  std::string work_dir;     // where `latest` looks (work_dir/checkpoints)
  int64_t seed = 0;         // train.seed: must be the checkpoint's
  std::string model;        // the model's name: must be the checkpoint's
};

// The checkpoint folder to resume from (the same on every rank), or "" to start fresh.
// `skip`: folders found damaged while being read (resume_from latest passes them over).
std::string choose_checkpoint(const ResumeOptions& o, dist::Runtime& rt, const std::vector<std::string>& skip = {});

// Throws a UsageError (exit 2) naming the keys when the checkpoint was trained with another
// seed or model: the sample stream could not continue. (Another global batch can: the
// trainer re-batches the epoch's unseen samples.)
void check_resumable(const ckpt::TrainerState& saved, const ResumeOptions& o, const std::string& source);

// Reads and checks the chosen checkpoint (format 3: its state and JSON; the Checkpointer
// reads each rank's tensors); nothing when resume_from is empty or finds none.
std::optional<ckpt::Snapshot> read_resume_checkpoint(const ResumeOptions& o, dist::Runtime& rt, std::string& source,
                                                      const std::vector<std::string>& skip = {});

}  // namespace sana::train
