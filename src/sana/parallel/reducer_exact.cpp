// train.deterministic's gradient sums (ReducerOptions::exact, docs/deterministic.md): each
// backward's gradient, scaled by a power of two per bucket, added into an int64 accumulator
// and all-reduced as integers, which no order of addition changes.
#include <algorithm>
#include <cmath>
#include <limits>

#include "sana/parallel/bucketed_reducer.h"

namespace sana::parallel::detail {

// A micro-batch's gradient times 2^scale must stay below 2^52, so that the sum of up to
// 1024 micro-batches (the trainer's limit in this mode) stays below 2^62.
constexpr double kExactLimit = 4503599627370496.0;  // 2^52
constexpr int64_t kExactTarget = 48;                // the summed peak's bits aimed at
constexpr int64_t kExactLowest = -120, kExactHighest = 120;  // 2^scale stays a finite float

void BucketedReducer::absorb() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    auto& flat = buckets_[i].flat;
    auto& e = exact_state_[i];
    const int64_t n = flat.numel();
    auto scaled = flat * std::ldexp(1.0, static_cast<int>(e.scale));  // exact: a power of two
    const float peak = scaled.abs().max().item<float>();
    if (!std::isfinite(peak)) {
      e.acc[n + 1] += 1;
    } else if (peak >= kExactLimit) {
      e.acc[n] += 1;
    } else {
      e.acc.narrow(0, 0, n).add_(scaled.round_().to(torch::kInt64));
    }
    flat.zero_();
  }
  unabsorbed_ = false;
}

void BucketedReducer::finalize_exact() {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  if (unabsorbed_) absorb();
  bool overflow = false, nonfinite = false;
  for (auto& e : exact_state_) {
    rt_.all_reduce(e.acc);  // integers: the same sum in any order
    const int64_t n = e.acc.numel() - 2;
    overflow = overflow || e.acc[n].item<int64_t>() > 0;
    nonfinite = nonfinite || e.acc[n + 1].item<int64_t>() > 0;
  }
  overflowed_ = overflow && !nonfinite;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    auto& e = exact_state_[i];
    auto& flat = buckets_[i].flat;
    const auto values = e.acc.narrow(0, 0, flat.numel());
    if (nonfinite) {
      flat.fill_(std::numeric_limits<float>::quiet_NaN());  // the trainer skips the step, as any non-finite one
    } else if (overflowed_) {
      // The caller runs the backward again; the buckets that overflowed with a smaller scale.
      if (e.acc[flat.numel()].item<int64_t>() > 0) e.scale = std::max(kExactLowest, e.scale - 12);
    } else {
      flat.copy_(values.to(torch::kFloat64).mul_(std::ldexp(1.0, static_cast<int>(-e.scale))));
      // The next step's scale from this sum's peak (the same on every rank).
      const auto peak = static_cast<uint64_t>(values.abs().max().item<int64_t>());
      if (peak > 0) {
        const int64_t bits = 64 - __builtin_clzll(peak);
        e.scale = std::clamp(e.scale + kExactTarget - bits, kExactLowest, kExactHighest);
      }
    }
    e.acc.zero_();
  }
}

std::vector<int64_t> BucketedReducer::exact_scales() const {
  std::vector<int64_t> out;
  for (const auto& e : exact_state_) out.push_back(e.scale);
  return out;
}

void BucketedReducer::set_exact_scales(const std::vector<int64_t>& scales) {
  if (scales.size() != exact_state_.size()) return;  // another bucket layout: start afresh
  for (size_t i = 0; i < scales.size(); ++i) exact_state_[i].scale = std::clamp(scales[i], kExactLowest, kExactHighest);
}

}  // namespace sana::parallel::detail
