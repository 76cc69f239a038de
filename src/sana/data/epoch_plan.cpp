#include "sana/data/epoch_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "sana/util/hash.h"
#include "sana/util/random.h"

namespace sana::data {

EpochPlan EpochPlan::build(const std::vector<uint16_t>& bucket_of, int num_buckets,
                           int64_t global_batch, uint64_t seed, int64_t epoch, TailPolicy tail) {
  if (global_batch < 1) throw std::invalid_argument("global batch size must be at least 1");
  EpochPlan plan;
  plan.global_batch_ = global_batch;
  plan.epoch_ = epoch;
  PlanStats& st = plan.stats_;
  st.num_samples = static_cast<int64_t>(bucket_of.size());
  st.samples_per_bucket.assign(static_cast<size_t>(num_buckets), 0);
  st.steps_per_bucket.assign(static_cast<size_t>(num_buckets), 0);

  // Members of each bucket, in sample-id order (two passes: counts, then fill).
  std::vector<int64_t> start(static_cast<size_t>(num_buckets) + 1, 0);
  for (uint16_t b : bucket_of) {
    if (b >= num_buckets) throw std::invalid_argument(fmt::format("bucket id {} out of range", b));
    ++st.samples_per_bucket[b];
  }
  std::partial_sum(st.samples_per_bucket.begin(), st.samples_per_bucket.end(), start.begin() + 1);
  std::vector<SampleId> members(bucket_of.size());
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (size_t i = 0; i < bucket_of.size(); ++i) {
      members[static_cast<size_t>(fill[bucket_of[i]]++)] = static_cast<SampleId>(i);
    }
  }

  // 1-2. Shuffle each bucket from (seed, epoch, bucket); cut into global batches.
  for (int b = 0; b < num_buckets; ++b) {
    SampleId* first = members.data() + start[static_cast<size_t>(b)];
    const int64_t n = st.samples_per_bucket[static_cast<size_t>(b)];
    if (n == 0) continue;
    util::RandomStream rng(util::stream_key(
        "plan.bucket", {seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(b)}));
    util::shuffle(first, first + n, rng);
    int64_t full = n / global_batch;
    const int64_t rest = n % global_batch;
    plan.ids_.insert(plan.ids_.end(), first, first + full * global_batch);
    if (rest > 0 && tail == TailPolicy::pad) {
      // The tail is filled by wrapping around the bucket's shuffled order, so every
      // sample appears at least once and the batch keeps its shape and resolution.
      for (int64_t k = 0; k < global_batch; ++k) {
        plan.ids_.push_back(first[(full * global_batch + k) % n]);
      }
      st.padded += global_batch - rest;
      ++full;
    } else {
      st.dropped += rest;
    }
    st.steps_per_bucket[static_cast<size_t>(b)] = full;
    plan.step_bucket_.insert(plan.step_bucket_.end(), static_cast<size_t>(full),
                             static_cast<uint16_t>(b));
  }

  // 3. Shuffle the order of all global batches from (seed, epoch).
  const int64_t steps = static_cast<int64_t>(plan.step_bucket_.size());
  std::vector<int64_t> order(static_cast<size_t>(steps));
  std::iota(order.begin(), order.end(), 0);
  util::RandomStream rng(util::stream_key("plan.order", {seed, static_cast<uint64_t>(epoch)}));
  util::shuffle(order.begin(), order.end(), rng);
  std::vector<SampleId> ids(plan.ids_.size());
  std::vector<uint16_t> buckets(plan.step_bucket_.size());
  for (int64_t j = 0; j < steps; ++j) {
    const auto from = static_cast<size_t>(order[static_cast<size_t>(j)]);
    buckets[static_cast<size_t>(j)] = plan.step_bucket_[from];
    std::copy_n(plan.ids_.begin() + static_cast<std::ptrdiff_t>(from * global_batch), global_batch,
                ids.begin() + static_cast<std::ptrdiff_t>(j * global_batch));
  }
  plan.ids_ = std::move(ids);
  plan.step_bucket_ = std::move(buckets);
  st.steps = steps;
  return plan;
}

EpochPlan EpochPlan::from_batches(std::vector<SampleId> ids, std::vector<uint16_t> step_buckets,
                                  int64_t global_batch, int64_t epoch, PlanStats stats) {
  if (static_cast<int64_t>(ids.size()) != static_cast<int64_t>(step_buckets.size()) * global_batch) {
    throw std::invalid_argument("a plan needs steps x global batch sample ids");
  }
  EpochPlan plan;
  plan.global_batch_ = global_batch;
  plan.epoch_ = epoch;
  plan.ids_ = std::move(ids);
  plan.step_bucket_ = std::move(step_buckets);
  plan.stats_ = std::move(stats);
  plan.stats_.steps = plan.steps();
  return plan;
}

std::vector<SampleId> EpochPlan::micro_batch(int64_t step, int rank, int world, int64_t micro,
                                             int64_t micro_step) const {
  const int64_t first = (micro_step * world + rank) * micro;
  if (first + micro > global_batch_) {
    throw std::out_of_range(fmt::format(
        "micro-step {} of rank {} (world {}, micro-batch {}) is outside a global batch of {}",
        micro_step, rank, world, micro, global_batch_));
  }
  const SampleId* b = batch(step);
  return std::vector<SampleId>(b + first, b + first + micro);
}

std::vector<SampleId> EpochPlan::rank_slice(int64_t step, int rank, int world,
                                            int64_t micro) const {
  std::vector<SampleId> out;
  const int64_t accumulation = global_batch_ / (micro * world);
  for (int64_t t = 0; t < accumulation; ++t) {
    const auto part = micro_batch(step, rank, world, micro, t);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string EpochPlan::fingerprint() const {
  Hasher h;
  h.update_value(global_batch_);
  h.update(step_bucket_.data(), step_bucket_.size() * sizeof(uint16_t));
  h.update(ids_.data(), ids_.size() * sizeof(SampleId));
  return h.hex();
}

}  // namespace sana::data
