// The epoch plan (docs/epoch_plan.md): every rank computes the same global
// batches from (bucket members, batch size per bucket, seed, epoch) alone, so all ranks
// have the same number of steps by construction and the position in training is one
// number, the step. World size, rank and worker count are not inputs; they only pick a
// slice of a step. The plan holds O(buckets) numbers, never the sample order: a bucket's
// order is a keyed permutation, and the order of global batches a merge of the buckets'
// batches by keys that keep each bucket's batches in order (so a resumed run with another
// batch size knows the samples not yet seen: a suffix of each bucket's order). No torch,
// no I/O, no collectives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/data/bucket_members.h"

namespace sana::data {

// data.tail: what happens to a bucket's last partial global batch. The enumerators' values
// are part of the plan's hash: never reorder them.
enum class TailPolicy { drop, pad };
const char* tail_name(TailPolicy tail);  // "drop" or "pad", as data.tail writes it

struct PlanStats {
  int64_t num_samples = 0;
  int64_t steps = 0;
  int64_t dropped = 0;  // samples left out of this epoch (tails with drop)
  int64_t padded = 0;   // repeated samples filling tails (pad)
  std::vector<int64_t> samples_per_bucket;
  std::vector<int64_t> steps_per_bucket;
  std::vector<int64_t> batch_per_bucket;  // the global batch of each bucket's steps (the last segment's)
};

// A part of an epoch batched with one set of global batch sizes. An epoch has one; a run
// resumed mid-epoch with another batch size adds one at the step it resumed from, which
// re-batches the samples the epoch has not yet seen.
struct PlanSegment {
  int64_t first_step = 0;
  std::vector<int64_t> batch;  // global batch size per bucket (>= 1)
};

// One global batch: its bucket and sample ids.
struct StepBatch {
  int64_t step = 0;
  int bucket = 0;
  std::vector<SampleId> ids;
};

// Rank `rank`'s part [first, second) of a global batch of `global` samples on `world`
// ranks: consecutive, sizes differing by at most one (8 on 3: 3, 3, 2).
std::pair<int64_t, int64_t> rank_share(int64_t global, int rank, int world);
// Micro-batches of at most `micro` samples a share of `share` samples takes.
int64_t micro_batches(int64_t share, int64_t micro);
// train.deterministic's share: the global batch cut into micro-batches of `micro` (the
// last smaller) and those dealt out whole, counts differing by one at most, so that every
// micro-batch holds the same samples at any world size. Empty when world > micro-batches.
std::pair<int64_t, int64_t> rank_share_whole(int64_t global, int64_t micro, int rank, int world);
// Rank `rank`'s part of a global batch: rank_share_whole's (`whole`, train.deterministic) or
// rank_share's.
std::pair<int64_t, int64_t> rank_share_of(int64_t global, int64_t micro, int rank, int world, bool whole);
// The most micro-batches of at most `micro` samples any rank runs for a global batch of
// `global` (`whole`: rank_share_whole's shares, else rank_share's).
int64_t most_micro_batches(int64_t global, int64_t micro, int world, bool whole);

class EpochPlan {
 public:
  // The plan of `epoch` over `members`: segments in order of first_step, the first at 0.
  static EpochPlan build(std::shared_ptr<const BucketMembers> members, std::vector<PlanSegment> segments,
                         uint64_t seed, int64_t epoch, TailPolicy tail);
  // One global batch size for every bucket, one segment.
  static EpochPlan build(std::shared_ptr<const BucketMembers> members, int64_t global_batch, uint64_t seed,
                         int64_t epoch, TailPolicy tail);
  // A plan from given global batches (steps x global_batch ids, one bucket per step),
  // e.g. DistributedSampler's partition laid out as global batches.
  static EpochPlan from_batches(std::vector<SampleId> ids, std::vector<uint16_t> step_buckets,
                                int64_t global_batch, int64_t epoch, PlanStats stats);

  int64_t steps() const { return steps_; }
  int64_t epoch() const { return epoch_; }
  // Step `step`'s global batch: O(64 x buckets + its size) time.
  StepBatch batch(int64_t step) const;
  // Rank `rank`'s share of step `step` on `world` ranks.
  std::vector<SampleId> rank_slice(int64_t step, int rank, int world) const;

  // Steps in order from `first_step`: O(log buckets + batch size) per step.
  class Cursor {
   public:
    bool next(StepBatch& out);  // false after the last step
    int64_t step() const { return step_; }

   private:
    friend class EpochPlan;
    Cursor(const EpochPlan& plan, int64_t first_step);
    void enter_segment(size_t s, int64_t local_step);
    const EpochPlan* plan_;
    int64_t step_ = 0;
    size_t segment_ = 0;
    std::vector<int64_t> taken_;  // per bucket: batches of the segment already passed
    std::vector<std::pair<int64_t, int>> heap_;  // unused for materialized plans
  };
  Cursor cursor(int64_t first_step = 0) const { return Cursor(*this, first_step); }

  const PlanStats& stats() const { return stats_; }
  // The smallest global batch among the steps (world sizes above it leave a rank idle).
  int64_t min_batch() const;
  // A hash of what determines every step: ranks compare it at each epoch start.
  std::string fingerprint() const { return fingerprint_; }

 private:
  struct Segment {
    int64_t first_step = 0, steps = 0;
    std::vector<int64_t> batch, offset, batches;  // per bucket: size, first position, count
    uint64_t key = 0;                             // of the batches' merge keys
  };
  // Batch `c` of bucket `b` in a segment: its merge key's numerator (the key is
  // (c + u / 2^32) / batches, u from the segment's key).
  uint64_t key_numerator(const Segment& seg, int b, int64_t c) const;
  bool key_less(const Segment& seg, int b1, int64_t c1, int b2, int64_t c2) const;
  // Per bucket: how many of its batches the segment's first `local_step` steps take.
  std::vector<int64_t> taken_before(const Segment& seg, int64_t local_step) const;
  // The bucket whose next batch (after `taken` of each) comes first in the merge order.
  int next_bucket(const Segment& seg, const std::vector<int64_t>& taken) const;
  size_t segment_of(int64_t step) const;
  StepBatch assemble(const Segment& seg, int b, int64_t c, int64_t step) const;
  void finish_stats(TailPolicy tail);

  int64_t epoch_ = 0, steps_ = 0;
  uint64_t order_key_ = 0;  // of each bucket's sample order
  std::shared_ptr<const BucketMembers> members_;
  std::vector<Segment> segments_;
  // Materialized plans (from_batches) only.
  int64_t fixed_batch_ = 0;
  std::vector<uint16_t> fixed_buckets_;
  std::vector<SampleId> fixed_ids_;
  PlanStats stats_;
  std::string fingerprint_;
};

}  // namespace sana::data
