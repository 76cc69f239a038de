#include "sana/train/input/batching.h"

#include <fmt/format.h>

#include <algorithm>

#include "sana/util/error.h"

namespace sana::train {

void check_world_fits(const data::EpochPlan& plan, int world, const data::BatchSpec& spec) {
  if (plan.steps() == 0 || plan.min_batch() >= world) return;
  throw UsageError(fmt::format("{} makes global batches of {} samples, fewer than the {} processes: every process "
                               "needs at least one sample per step; raise it or start fewer processes",
                               spec.describe(), plan.min_batch(), world),
                   "config error");
}

void check_deterministic(const data::EpochPlan& plan, const BatchOptions& t, dist::Runtime& rt) {
  const int64_t fewest = data::micro_batches(plan.min_batch(), t.micro_batch_size);
  if (plan.steps() > 0 && fewest < rt.world_size()) {
    throw UsageError(fmt::format("train.deterministic deals out whole micro-batches: a global batch of {} in "
                                 "micro-batches of {} is {}, fewer than the {} processes; lower "
                                 "train.micro_batch_size or start fewer processes",
                                 plan.min_batch(), t.micro_batch_size, fewest, rt.world_size()),
                     "config error");
  }
  int64_t largest = 0;
  for (int64_t g : plan.stats().batch_per_bucket) largest = std::max(largest, g);
  if (data::micro_batches(largest, t.micro_batch_size) > 1024) {
    throw UsageError(fmt::format("train.deterministic sums at most 1024 micro-batches a step; a global batch of {} "
                                 "in micro-batches of {} is more: raise train.micro_batch_size",
                                 largest, t.micro_batch_size),
                     "config error");
  }
  if (rt.device().is_cuda()) at::globalContext().setDeterministicAlgorithms(true, false);
}

std::string batch_text(const data::Dataset& ds, const BatchOptions& t, int rank, int world) {
  const auto plan = ds.plan(0);
  const auto& sizes = plan.stats().batch_per_bucket;
  const auto& steps = plan.stats().steps_per_bucket;
  int64_t low = 0, high = 0;
  for (size_t b = 0; b < sizes.size(); ++b) {
    if (steps[b] == 0) continue;
    low = low == 0 ? sizes[b] : std::min(low, sizes[b]);
    high = std::max(high, sizes[b]);
  }
  if (t.batch.batch_tokens > 0) {
    return fmt::format("train.batch_tokens {}: global batches of {} to {} samples by bucket, micro-batches of at "
                       "most {}",
                       t.batch.batch_tokens, low, high, t.micro_batch_size);
  }
  const auto [first, last] = data::rank_share_of(t.batch.global_batch, t.micro_batch_size, rank, world, t.deterministic);
  const int64_t micro = data::micro_batches(last - first, t.micro_batch_size);
  return fmt::format("global batch {}: {} samples on this rank in {} micro-batch{} of at most {}{}", t.batch.global_batch,
                     last - first, micro, micro == 1 ? "" : "es", t.micro_batch_size,
                     t.deterministic ? " (train.deterministic: integer gradient sums)" : "");
}

std::string before_text(const ckpt::TrainerState& saved) {
  return data::BatchSpec{saved.global_batch_size, saved.batch_tokens}.describe();
}

}  // namespace sana::train
