#include "sana/data/epoch_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "sana/util/hash.h"
#include "sana/util/permutation.h"
#include "sana/util/random.h"

namespace sana::data {

const char* tail_name(TailPolicy tail) { return tail == TailPolicy::pad ? "pad" : "drop"; }

namespace {
using u128 = unsigned __int128;

uint64_t mix(uint64_t key, uint64_t a, uint64_t b) {
  util::RandomStream s(key ^ (a * 0x9e3779b97f4a7c15ULL) ^ (b * 0xc2b2ae3d27d4eb4fULL));
  return s.next_u64();
}
}  // namespace

std::pair<int64_t, int64_t> rank_share(int64_t global, int rank, int world) {
  const int64_t base = global / world, extra = global % world;
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  return {first, first + base + (rank < extra ? 1 : 0)};
}

int64_t micro_batches(int64_t share, int64_t micro) { return (share + micro - 1) / micro; }

std::pair<int64_t, int64_t> rank_share_whole(int64_t global, int64_t micro, int rank, int world) {
  const auto [first, last] = rank_share(micro_batches(global, micro), rank, world);
  return {std::min(global, first * micro), std::min(global, last * micro)};
}

std::pair<int64_t, int64_t> rank_share_of(int64_t global, int64_t micro, int rank, int world, bool whole) {
  return whole ? rank_share_whole(global, micro, rank, world) : rank_share(global, rank, world);
}

int64_t most_micro_batches(int64_t global, int64_t micro, int world, bool whole) {
  int64_t most = 0;
  for (int r = 0; r < world; ++r) {
    const auto [first, last] = rank_share_of(global, micro, r, world, whole);
    most = std::max(most, micro_batches(last - first, micro));
  }
  return most;
}

EpochPlan EpochPlan::build(std::shared_ptr<const BucketMembers> members, int64_t global_batch, uint64_t seed,
                           int64_t epoch, TailPolicy tail) {
  if (global_batch < 1) throw std::invalid_argument("global batch size must be at least 1");
  const auto buckets = static_cast<size_t>(members->buckets());
  return build(std::move(members), {PlanSegment{0, std::vector<int64_t>(buckets, global_batch)}}, seed, epoch, tail);
}

// Each segment cuts what remains of each bucket's order (a suffix, from `offset`) into
// global batches; the steps of a segment before the next one starts consume a prefix of
// every bucket's batches, which moves the offsets on.
EpochPlan EpochPlan::build(std::shared_ptr<const BucketMembers> members, std::vector<PlanSegment> segments,
                           uint64_t seed, int64_t epoch, TailPolicy tail) {
  if (segments.empty() || segments.front().first_step != 0) {
    throw std::invalid_argument("an epoch plan's first segment starts at step 0");
  }
  EpochPlan plan;
  plan.epoch_ = epoch;
  plan.members_ = std::move(members);
  plan.order_key_ = util::stream_key("plan.bucket", {seed, static_cast<uint64_t>(epoch)});
  const int nb = plan.members_->buckets();
  Hasher h;
  h.update(std::string("plan v2"));
  for (uint64_t v : {seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(tail)}) h.update_value(v);
  for (int b = 0; b < nb; ++b) h.update_value(plan.members_->count(b));
  std::vector<int64_t> offset(static_cast<size_t>(nb), 0);
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto& spec = segments[i];
    if (spec.batch.size() != static_cast<size_t>(nb)) throw std::invalid_argument("a batch size per bucket");
    Segment seg;
    seg.first_step = spec.first_step;
    seg.batch = spec.batch;
    seg.offset = offset;
    seg.key = util::stream_key("plan.order", {seed, static_cast<uint64_t>(epoch), i});
    for (int b = 0; b < nb; ++b) {
      const auto k = static_cast<size_t>(b);
      const int64_t g = seg.batch[k], left = plan.members_->count(b) - offset[k];
      if (g < 1) throw std::invalid_argument("global batch size must be at least 1");
      seg.batches.push_back(left / g + (left % g > 0 && tail == TailPolicy::pad ? 1 : 0));
      seg.steps += seg.batches.back();
    }
    h.update_value(seg.first_step);
    h.update(seg.batch.data(), seg.batch.size() * sizeof(int64_t));
    if (i + 1 < segments.size()) {
      const int64_t local = segments[i + 1].first_step - seg.first_step;
      if (local < 0 || local > seg.steps) {
        throw std::invalid_argument(fmt::format("plan segment {} starts at step {}, outside the previous one's steps",
                                                i + 1, segments[i + 1].first_step));
      }
      const auto taken = plan.taken_before(seg, local);
      for (int b = 0; b < nb; ++b) {
        const auto k = static_cast<size_t>(b);
        offset[k] = std::min(plan.members_->count(b), offset[k] + taken[k] * seg.batch[k]);
      }
    }
    plan.segments_.push_back(std::move(seg));
  }
  plan.steps_ = plan.segments_.back().first_step + plan.segments_.back().steps;
  plan.fingerprint_ = h.hex();
  plan.finish_stats(tail);
  return plan;
}

void EpochPlan::finish_stats(TailPolicy tail) {
  const int nb = members_->buckets();
  PlanStats& st = stats_;
  st.num_samples = members_->total();
  st.steps = steps_;
  st.samples_per_bucket.assign(static_cast<size_t>(nb), 0);
  st.steps_per_bucket.assign(static_cast<size_t>(nb), 0);
  for (size_t i = 0; i < segments_.size(); ++i) {
    const auto& seg = segments_[i];
    const auto taken = i + 1 < segments_.size() ? taken_before(seg, segments_[i + 1].first_step - seg.first_step)
                                                : seg.batches;
    for (size_t b = 0; b < taken.size(); ++b) st.steps_per_bucket[b] += taken[b];
  }
  const auto& last = segments_.back();
  st.batch_per_bucket = last.batch;
  for (int b = 0; b < nb; ++b) {
    const auto k = static_cast<size_t>(b);
    st.samples_per_bucket[k] = members_->count(b);
    const int64_t left = members_->count(b) - last.offset[k], rest = left % last.batch[k];
    if (rest == 0) continue;
    if (tail == TailPolicy::pad) {
      st.padded += last.batch[k] - rest;
    } else {
      st.dropped += rest;
    }
  }
}

EpochPlan EpochPlan::from_batches(std::vector<SampleId> ids, std::vector<uint16_t> step_buckets,
                                  int64_t global_batch, int64_t epoch, PlanStats stats) {
  if (static_cast<int64_t>(ids.size()) != static_cast<int64_t>(step_buckets.size()) * global_batch) {
    throw std::invalid_argument("a plan needs steps x global batch sample ids");
  }
  EpochPlan plan;
  plan.epoch_ = epoch;
  plan.fixed_batch_ = global_batch;
  plan.fixed_ids_ = std::move(ids);
  plan.fixed_buckets_ = std::move(step_buckets);
  plan.steps_ = static_cast<int64_t>(plan.fixed_buckets_.size());
  plan.stats_ = std::move(stats);
  plan.stats_.steps = plan.steps_;
  Hasher h;
  h.update_value(global_batch);
  h.update(plan.fixed_buckets_.data(), plan.fixed_buckets_.size() * sizeof(uint16_t));
  h.update(plan.fixed_ids_.data(), plan.fixed_ids_.size() * sizeof(SampleId));
  plan.fingerprint_ = h.hex();
  return plan;
}

uint64_t EpochPlan::key_numerator(const Segment& seg, int b, int64_t c) const {
  return static_cast<uint64_t>(c) << 32 | mix(seg.key, static_cast<uint64_t>(b), static_cast<uint64_t>(c)) >> 32;
}

// Batch c of bucket b has the key (c + u) / batches_b with u in [0, 1): a bucket's
// batches come in order, spread evenly over the segment with a random jitter, and the
// buckets interleave at random. Compared exactly (128-bit cross products); ties by bucket.
bool EpochPlan::key_less(const Segment& seg, int b1, int64_t c1, int b2, int64_t c2) const {
  const u128 left = static_cast<u128>(key_numerator(seg, b1, c1)) * static_cast<uint64_t>(seg.batches[static_cast<size_t>(b2)]);
  const u128 right = static_cast<u128>(key_numerator(seg, b2, c2)) * static_cast<uint64_t>(seg.batches[static_cast<size_t>(b1)]);
  return left < right || (left == right && b1 < b2);
}

// The keys below t / 2^64 are a prefix of the merge order, and per bucket they are
// counted in O(1): batch c's key is below exactly when c * 2^64 + u * 2^32 < t * batches.
// A binary search on t finds the largest prefix not longer than `local_step`; the few keys
// left (those within 2^-64 of each other) are merged one by one.
std::vector<int64_t> EpochPlan::taken_before(const Segment& seg, int64_t local_step) const {
  const int nb = static_cast<int>(seg.batches.size());
  if (local_step >= seg.steps) return seg.batches;
  std::vector<int64_t> taken(static_cast<size_t>(nb), 0);
  if (local_step <= 0) return taken;
  auto below = [&](uint64_t t, std::vector<int64_t>* out) {
    int64_t total = 0;
    for (int b = 0; b < nb; ++b) {
      const auto k = static_cast<uint64_t>(seg.batches[static_cast<size_t>(b)]);
      const u128 x = static_cast<u128>(t) * k;
      const auto c0 = static_cast<uint64_t>(x >> 64);
      uint64_t n = c0;
      if (c0 < k && (mix(seg.key, static_cast<uint64_t>(b), c0) >> 32 << 32) < static_cast<uint64_t>(x)) ++n;
      n = std::min(n, k);
      if (out) (*out)[static_cast<size_t>(b)] = static_cast<int64_t>(n);
      total += static_cast<int64_t>(n);
    }
    return total;
  };
  uint64_t t = 0;
  for (int bit = 63; bit >= 0; --bit) {
    const uint64_t candidate = t | uint64_t{1} << bit;
    if (below(candidate, nullptr) <= local_step) t = candidate;
  }
  for (int64_t done = below(t, &taken); done < local_step; ++done) ++taken[static_cast<size_t>(next_bucket(seg, taken))];
  return taken;
}

int EpochPlan::next_bucket(const Segment& seg, const std::vector<int64_t>& taken) const {
  int best = -1;
  for (int b = 0; b < static_cast<int>(taken.size()); ++b) {
    const auto k = static_cast<size_t>(b);
    if (taken[k] >= seg.batches[k]) continue;
    if (best < 0 || key_less(seg, b, taken[k], best, taken[static_cast<size_t>(best)])) best = b;
  }
  return best;
}

size_t EpochPlan::segment_of(int64_t step) const {
  size_t s = 0;
  while (s + 1 < segments_.size() && segments_[s + 1].first_step <= step) ++s;
  return s;
}

StepBatch EpochPlan::assemble(const Segment& seg, int b, int64_t c, int64_t step) const {
  StepBatch out;
  out.step = step;
  out.bucket = b;
  const auto k = static_cast<size_t>(b);
  const int64_t g = seg.batch[k], n = members_->count(b);
  const util::KeyedPermutation order(static_cast<uint64_t>(n), util::stream_key("plan.bucket", {order_key_, k}));
  out.ids.reserve(static_cast<size_t>(g));
  for (int64_t q = 0; q < g; ++q) {
    int64_t p = seg.offset[k] + c * g + q;
    // A padded tail wraps around to the start of the bucket's order: every sample once,
    // and the batch keeps its shape.
    if (p >= n) p = (p - n) % n;
    out.ids.push_back(members_->member(b, static_cast<int64_t>(order(static_cast<uint64_t>(p)))));
  }
  return out;
}

StepBatch EpochPlan::batch(int64_t step) const {
  if (step < 0 || step >= steps_) throw std::out_of_range(fmt::format("step {} of a {}-step plan", step, steps_));
  if (!members_) {
    StepBatch out{step, fixed_buckets_[static_cast<size_t>(step)], {}};
    const auto first = fixed_ids_.begin() + static_cast<std::ptrdiff_t>(step * fixed_batch_);
    out.ids.assign(first, first + fixed_batch_);
    return out;
  }
  const auto& seg = segments_[segment_of(step)];
  const auto taken = taken_before(seg, step - seg.first_step);
  const int best = next_bucket(seg, taken);
  return assemble(seg, best, taken[static_cast<size_t>(best)], step);
}

std::vector<SampleId> EpochPlan::rank_slice(int64_t step, int rank, int world) const {
  auto all = batch(step).ids;
  const auto [first, last] = rank_share(static_cast<int64_t>(all.size()), rank, world);
  return std::vector<SampleId>(all.begin() + first, all.begin() + last);
}

int64_t EpochPlan::min_batch() const {
  if (!members_) return fixed_batch_;
  int64_t out = 0;
  for (const auto& seg : segments_) {
    for (size_t b = 0; b < seg.batch.size(); ++b) {
      if (seg.batches[b] > 0 && (out == 0 || seg.batch[b] < out)) out = seg.batch[b];
    }
  }
  return out;
}

EpochPlan::Cursor::Cursor(const EpochPlan& plan, int64_t first_step) : plan_(&plan), step_(first_step) {
  if (first_step < 0 || first_step > plan.steps_) {
    throw std::out_of_range(fmt::format("step {} of a {}-step plan", first_step, plan.steps_));
  }
  if (!plan.members_ || first_step == plan.steps_) return;
  segment_ = plan.segment_of(first_step);
  enter_segment(segment_, first_step - plan.segments_[segment_].first_step);
}

void EpochPlan::Cursor::enter_segment(size_t s, int64_t local_step) {
  const auto& seg = plan_->segments_[s];
  segment_ = s;
  taken_ = plan_->taken_before(seg, local_step);
  heap_.clear();
  for (size_t b = 0; b < taken_.size(); ++b) {
    if (taken_[b] < seg.batches[b]) heap_.emplace_back(taken_[b], static_cast<int>(b));
  }
  auto later = [this, &seg](const std::pair<int64_t, int>& x, const std::pair<int64_t, int>& y) {
    return plan_->key_less(seg, y.second, y.first, x.second, x.first);
  };
  std::make_heap(heap_.begin(), heap_.end(), later);
}

bool EpochPlan::Cursor::next(StepBatch& out) {
  if (step_ >= plan_->steps_) return false;
  if (!plan_->members_) {
    out = plan_->batch(step_++);
    return true;
  }
  if (segment_ + 1 < plan_->segments_.size() && plan_->segments_[segment_ + 1].first_step <= step_) {
    enter_segment(plan_->segment_of(step_), 0);
  }
  const auto& seg = plan_->segments_[segment_];
  auto later = [this, &seg](const std::pair<int64_t, int>& x, const std::pair<int64_t, int>& y) {
    return plan_->key_less(seg, y.second, y.first, x.second, x.first);
  };
  std::pop_heap(heap_.begin(), heap_.end(), later);
  const auto [c, b] = heap_.back();
  heap_.pop_back();
  out = plan_->assemble(seg, b, c, step_++);
  ++taken_[static_cast<size_t>(b)];
  if (c + 1 < seg.batches[static_cast<size_t>(b)]) {
    heap_.emplace_back(c + 1, b);
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
  return true;
}

}  // namespace sana::data
