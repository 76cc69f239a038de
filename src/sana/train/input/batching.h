// How the trainer sizes and deals out its global batches, said and checked at start:
// more processes than samples (or, with train.deterministic, than micro-batches) in a step
// are config errors, and the log line says what each rank takes.
#pragma once

#include <string>

#include "sana/ckpt/checkpoint.h"
#include "sana/data/dataset.h"
#include "sana/data/epoch_plan.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// How each step's global batch is dealt out to the ranks: the train.* keys by their names.
struct BatchOptions {
  data::BatchSpec batch;          // train.global_batch_size or train.batch_tokens
  int64_t micro_batch_size = 1;   // train.micro_batch_size
  bool deterministic = false;     // train.deterministic: whole micro-batches per rank
};

// Throws a config-kind UsageError when some step's global batch is smaller than `world`.
void check_world_fits(const data::EpochPlan& plan, int world, const data::BatchSpec& spec);
// train.deterministic deals out whole micro-batches: one at least for every rank, at most
// 1024 a step (the integer sums' headroom). Turns on torch's deterministic algorithms on CUDA.
void check_deterministic(const data::EpochPlan& plan, const BatchOptions& o, dist::Runtime& rt);
// "global batch 8: 3 samples on this rank in 2 micro-batches of at most 2", or with
// train.batch_tokens the range of global batches over the buckets.
std::string batch_text(const data::Dataset& ds, const BatchOptions& o, int rank, int world);
// The batch a checkpoint was trained with, as the config key says it.
std::string before_text(const ckpt::TrainerState& saved);

}  // namespace sana::train
