// Where a resumed run starts: rank 0 resolves `resume_from` (latest or a path) and every
// rank loads the checkpoint it chose; a checkpoint that cannot continue this run's sample
// stream is refused before anything is loaded.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sana/ckpt/checkpoint.h"
#include "sana/config/config.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// The checkpoint folder to resume from (the same on every rank), or "" to start fresh.
// `skip`: folders found damaged while being read (resume_from latest passes them over).
std::string choose_checkpoint(const config::Config& cfg, dist::Runtime& rt, const std::vector<std::string>& skip = {});

// Throws a UsageError (exit 2) naming the keys when the checkpoint was trained with another
// seed or model: the sample stream could not continue. (Another global batch can: the
// trainer re-batches the epoch's unseen samples.)
void check_resumable(const ckpt::TrainerState& saved, const config::Config& cfg, const std::string& model_name,
                     const std::string& source);

// Reads and checks the chosen checkpoint (format 3: its state and JSON; the Checkpointer
// reads each rank's tensors); nothing when resume_from is empty or finds none.
std::optional<ckpt::Snapshot> read_resume_checkpoint(const config::Config& cfg, dist::Runtime& rt,
                                                      const std::string& model_name, std::string& source,
                                                      const std::vector<std::string>& skip = {});

}  // namespace sana::train
