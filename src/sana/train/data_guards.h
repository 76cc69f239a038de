// The checks that keep every rank on the same data: at each epoch start the ranks
// compare the plan (fingerprint and step count), and at every step they add up their bad
// samples so that all stop together once data.max_bad_fraction is exceeded. The only
// place where data/ meets dist/ (DESIGN.md: train/ combines them).
#pragma once

#include <stdexcept>
#include <utility>

#include "sana/data/epoch_plan.h"
#include "sana/data/loader.h"
#include "sana/dist/runtime.h"

namespace sana::train {

// Throws dist::Disagreement on every rank when the ranks' plans differ.
void agree_on_epoch_plan(dist::Runtime& rt, const data::EpochPlan& plan);

// Too many bad samples across all ranks: every rank throws this at the same step.
class TooManyBadSamples : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Counts what the batches this rank consumed contained (not what was decoded ahead, which
// depends on thread timing), so every rank decides at the same step.
class BadSampleGuard {
 public:
  explicit BadSampleGuard(double max_fraction, int64_t min_reads = 64)
      : max_fraction_(max_fraction), min_reads_(min_reads) {}
  void add(const data::Batch& batch);
  // A collective: every rank calls it at the same steps.
  void check(dist::Runtime& rt);
  // For a caller that all-reduces these with its own numbers: this rank's (bad, reads),
  // then decide() on the sums (throws TooManyBadSamples).
  std::pair<double, double> local() const {
    return {static_cast<double>(bad_), static_cast<double>(reads_)};
  }
  void decide(double total_bad, double total_reads) const;
  // A resumed run continues the counts (each rank restores the run-wide totals on rank 0
  // only, so the sums stay right).
  void restore(int64_t bad, int64_t reads) {
    bad_ = bad;
    reads_ = reads;
  }

 private:
  double max_fraction_;
  int64_t min_reads_;  // below this many reads in all, a fraction means little
  int64_t bad_ = 0;
  int64_t reads_ = 0;
};

}  // namespace sana::train
