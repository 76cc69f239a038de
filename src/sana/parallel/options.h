// The options of the data-parallel engines (parallel/): the ddp.* keys and what
// train.zero_stage and train.deterministic ask of the gradient reduction, by the same
// names; train/options/core_options.h fills them from the run's config. No torch.
#pragma once

namespace sana::parallel {

// The gradient engine's options (reducer.h).
// What ZeRO shards (parallel/zero.h), by the key's name (train/options/ fills it).
struct ZeroOptions {
  int stage = 0;  // train.zero_stage: 0 (DDP) to 3
};

struct ReducerOptions {
  double bucket_cap_mb = 25.0;   // ddp.bucket_cap_mb: the cap of every bucket but the first
  double first_bucket_mb = 1.0;  // the cap of the first bucket
  // false: nothing starts before finalize() (for measuring what overlap gains).
  bool overlap = true;
  // true: gradients averaged over ranks (DDP); false: summed (the trainer normalises each
  // loss by the global batch itself, so uneven shares still give the full-batch gradient).
  bool average = true;
  // train.deterministic: each backward's gradient is added into an int64 fixed-point
  // accumulator (a power-of-two scale per bucket, the same on every rank) and all-reduced
  // as integers, which no order of addition changes; converted back once in finalize().
  // No overlap with the backward.
  bool exact = false;
  // train.zero_stage >= 2: each bucket's reduced gradient is kept only by the ranks owning
  // its parameters (shard_plan.h) and the bucket's memory is released as soon as its
  // reduction ends; the next backward allocates each bucket again when its first gradient
  // arrives. Under NCCL each segment is reduced to its owner; Gloo (LibTorch 1.13's has no
  // reduce-scatter) all-reduces the bucket as stage 0 does, so the sums are stage 0's to the
  // last bit, and the owners keep their segments. Off under `exact`, whose integer sums
  // every rank keeps whole.
  bool shard_gradients = false;
  // train.offload_optimizer: the kept gradients (this rank's segments, every segment on one
  // process) live in host memory (page-locked on CUDA), where the optimizer reads them. As
  // under shard_gradients, each bucket is allocated on the device when its first gradient
  // arrives and released once its reduced segments are copied out, so the device never
  // holds more than the buckets the backward is filling; at any process count and stage.
  // Off under `exact` (its integer sums stay on the device).
  bool gradients_on_host = false;
};

}  // namespace sana::parallel
