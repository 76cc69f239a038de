// The epoch plan (docs/design.md, "Epoch plan"): every rank computes the same list of global
// batches from (per-sample bucket, global batch size, seed, epoch) alone, so all ranks
// have the same number of steps by construction and the position in training is one
// number, the step. World size, rank and worker count are not inputs; they only pick
// a slice of a step. No torch, no I/O, no collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sana/config/config.h"

namespace sana::data {

// data.tail: what happens to a bucket's last partial global batch.
using TailPolicy = config::Tail;

using SampleId = uint32_t;

struct PlanStats {
  int64_t num_samples = 0;
  int64_t steps = 0;
  int64_t dropped = 0;  // samples left out of this epoch (tails with drop)
  int64_t padded = 0;   // repeated samples filling tails (pad)
  std::vector<int64_t> samples_per_bucket;
  std::vector<int64_t> steps_per_bucket;
};

class EpochPlan {
 public:
  // bucket_of[i] is sample i's bucket in [0, num_buckets).
  static EpochPlan build(const std::vector<uint16_t>& bucket_of, int num_buckets,
                         int64_t global_batch, uint64_t seed, int64_t epoch, TailPolicy tail);

  // A plan from given global batches (steps x global_batch ids, one bucket per step),
  // e.g. DistributedSampler's partition laid out as global batches.
  static EpochPlan from_batches(std::vector<SampleId> ids, std::vector<uint16_t> step_buckets,
                                int64_t global_batch, int64_t epoch, PlanStats stats);

  int64_t steps() const { return static_cast<int64_t>(step_bucket_.size()); }
  int64_t global_batch() const { return global_batch_; }
  int64_t epoch() const { return epoch_; }
  int bucket(int64_t step) const { return step_bucket_[static_cast<size_t>(step)]; }
  // The global batch of `step`: global_batch() sample ids, all from bucket(step).
  const SampleId* batch(int64_t step) const {
    return ids_.data() + static_cast<size_t>(step * global_batch_);
  }
  // Rank `rank`'s micro-batch `micro_step` of `step` for world size `world` and
  // micro-batch size `micro` (global batch = micro x accumulation x world):
  // ids [(micro_step*world + rank)*micro, +micro).
  std::vector<SampleId> micro_batch(int64_t step, int rank, int world, int64_t micro,
                                    int64_t micro_step) const;
  // Everything rank `rank` sees in `step`, its micro-batches in order.
  std::vector<SampleId> rank_slice(int64_t step, int rank, int world, int64_t micro) const;

  const PlanStats& stats() const { return stats_; }
  // A hash of every step's bucket and ids: ranks compare it at each epoch start.
  std::string fingerprint() const;

 private:
  int64_t global_batch_ = 0;
  int64_t epoch_ = 0;
  std::vector<uint16_t> step_bucket_;
  std::vector<SampleId> ids_;  // steps() x global_batch_
  PlanStats stats_;
};

}  // namespace sana::data
