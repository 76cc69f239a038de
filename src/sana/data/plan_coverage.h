// What an epoch plan leaves out, said before anything trains (training, `plan` and
// `check-data` all ask): a plan with no step, and buckets with fewer samples than their
// global batch under data.tail drop, which no epoch ever trains. No torch.
#pragma once

#include <string>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/data/epoch_plan.h"

namespace sana::data {

struct PlanCoverage {
  std::vector<int> untrained;   // buckets with samples and no step
  int64_t untrained_samples = 0;
  double untrained_fraction = 0;  // of all samples
};

PlanCoverage plan_coverage(const EpochPlan& plan);

// The bucket histogram: "bucket (base: key -> h x w), samples, global batch, steps" rows
// for the buckets holding samples.
std::string bucket_histogram(const Dataset& ds, const EpochPlan& plan);

// Throws a config-kind UsageError (exit 2) with the histogram and what to change when the
// plan has no step, or when the untrained share exceeds the dataset's max_untrained_fraction
// (data.max_untrained_fraction); logs
// a warning naming the untrained buckets otherwise, and what padding repeats. `who` starts
// each message ("plan", "training", ...). With `refuse` false (check-data, which looks at
// the data, not the run) the refusals are warnings.
void check_plan_coverage(const Dataset& ds, const EpochPlan& plan, const std::string& who, bool refuse = true);

}  // namespace sana::data
