// The micro-batch and gradient checkpointing a device holds, from the memory estimate
// (memory_estimate.h): what `sana-train model --device-memory` suggests and what
// train.micro_batch_size auto takes (the trainer resolves it, trainer_micro_batch.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sana/model/spec.h"
#include "sana/train/report/memory_estimate.h"

namespace sana::train {

// Kept out of a device's memory for the CUDA context and the caching allocator's slack
// (on the CPU: the loader's buffers and the process itself).
constexpr double kContextBytes = 2.0 * (1 << 30);

// A micro-batch and gradient checkpointing setting: gc_step 0 none, else every gc_step-th
// block; micro_batch 0 where none fits. `bytes`: the state and the activations.
struct MicroBatchChoice {
  int64_t gc_step = 0;
  int64_t micro_batch = 0;
  double bytes = 0;
};
// What `sana-train model --device-memory` suggests: for each setting (none, every second
// block, every block) the largest micro-batch (powers of two up to `most`, and `most`) whose
// state and activations fit in `budget` bytes; and the pick: the setting that recomputes
// least among those whose micro-batch holds 16384 image tokens of the largest bucket (or
// all of `most`), else the largest micro-batch. The activations are fp32's, an upper bound
// under autocast.
struct MicroBatchSuggestion {
  std::vector<MicroBatchChoice> largest;
  MicroBatchChoice pick;
};
MicroBatchSuggestion suggest_micro_batch(const MemoryEstimate& e, const model::ModelSpec& spec, double budget,
                                         int64_t most);

// The most samples one of `world` processes gets of a global batch of `global` (shares
// differ by at most one sample): the largest micro-batch worth suggesting.
int64_t largest_share(int64_t global, int world);

// `e` as if the run used `choice`'s micro-batch and checkpointing: its activations (both
// figures) and settings, from its measured terms. Its total() is then choice.bytes.
MemoryEstimate estimate_at(MemoryEstimate e, const model::ModelSpec& spec, const MicroBatchChoice& choice);

// The memory one process's micro-batch is fitted in, bytes (kContextBytes not yet taken
// off), and where it comes from, for the log: `gib` when above 0
// (train.micro_batch_memory_gib, or --device-memory, which the source names as the key), else CUDA device `cuda_index`'s memory
// when at least 0, else this host's available memory (/proc/meminfo's MemAvailable) over
// the `processes_on_host` processes that share it.
struct MemoryBudget {
  double bytes = 0;
  std::string source;
};
MemoryBudget memory_budget(double gib, int cuda_index, int processes_on_host);

// "train.grad_checkpointing false", "... true (every block)", "..., train.gc_step 2".
std::string checkpointing_name(int64_t gc_step);

}  // namespace sana::train
