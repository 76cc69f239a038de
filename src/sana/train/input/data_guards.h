// The checks that keep every rank on the same data: at each epoch start the ranks
// compare the plan (fingerprint and step count), and at every step they add up their bad
// samples so that all stop together once data.max_bad_fraction is exceeded. The only
// place where data/ meets distributed/ (train/ is the only layer that combines them).
#pragma once

#include <stdexcept>
#include <utility>

#include "sana/data/epoch_plan.h"
#include "sana/data/loader.h"
#include "sana/distributed/runtime.h"
#include "sana/util/error.h"
#include "sana/util/stateful.h"

namespace sana::train {

// Throws dist::Disagreement on every rank when the ranks' plans differ.
void agree_on_epoch_plan(dist::Runtime& rt, const data::EpochPlan& plan);

// Too many bad samples across all ranks: every rank throws this at the same step.
class TooManyBadSamples : public sana::RunError {
 public:
  explicit TooManyBadSamples(const std::string& what) : RunError(what, "too many bad samples") {}
};

// Counts what the batches this rank consumed contained (not what was decoded ahead, which
// depends on thread timing), so every rank decides at the same step. A stateful part
// ("bad_samples"): checkpoints carry the run-wide counts, and a resume restores them into
// the rank that `carries` them (rank 0).
class BadSampleGuard : public Stateful {
 public:
  static constexpr int64_t kMinReads = 64;  // below this many reads in all, a fraction means little
  explicit BadSampleGuard(double max_fraction, int64_t min_reads = kMinReads, bool carries = false)
      : max_fraction_(max_fraction), min_reads_(min_reads), carries_(carries) {}
  void add(const data::Batch& batch);
  // A collective: every rank calls it at the same steps.
  void check(dist::Runtime& rt);
  // For a caller that all-reduces these with its own numbers: this rank's (bad, reads),
  // then decide() on the sums (throws TooManyBadSamples).
  std::pair<double, double> local() const {
    return {static_cast<double>(bad_), static_cast<double>(reads_)};
  }
  // Keeps the totals as the run-wide counts a checkpoint carries.
  void decide(double total_bad, double total_reads);
  // The run-wide (bad, reads) as last agreed.
  std::pair<int64_t, int64_t> totals() const { return {total_bad_, total_reads_}; }
  // dist.elastic continue: the counts as a resume at the last agreed step has them (the
  // run-wide totals on the one rank that `carries`, none on the others).
  void regroup(bool carries) {
    carries_ = carries;
    bad_ = carries ? total_bad_ : 0;
    reads_ = carries ? total_reads_ : 0;
  }
  std::string state_name() const override { return "bad_samples"; }
  PartState save_state() const override {
    return {{{"bad_samples", total_bad_}, {"samples_read", total_reads_}}, std::nullopt, {}};
  }
  // A resumed run continues the counts: the run-wide totals are restored into one rank's
  // own counts only (`carries`, rank 0), so the sums over ranks stay right.
  void restore_state(const PartState* saved, const std::string& /*source*/) override {
    if (saved == nullptr) return;
    total_bad_ = saved->json.value("bad_samples", int64_t{0});
    total_reads_ = saved->json.value("samples_read", int64_t{0});
    if (!carries_) return;
    bad_ = total_bad_;
    reads_ = total_reads_;
  }

 private:
  double max_fraction_;
  int64_t min_reads_;  // below this many reads in all, a fraction means little
  bool carries_;
  int64_t bad_ = 0;
  int64_t reads_ = 0;
  int64_t total_bad_ = 0, total_reads_ = 0;
};

}  // namespace sana::train
