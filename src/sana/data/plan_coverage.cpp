#include "sana/data/plan_coverage.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::data {

PlanCoverage plan_coverage(const EpochPlan& plan) {
  PlanCoverage c;
  const auto& st = plan.stats();
  for (size_t b = 0; b < st.samples_per_bucket.size() && b < st.steps_per_bucket.size(); ++b) {
    if (st.samples_per_bucket[b] > 0 && st.steps_per_bucket[b] == 0) {
      c.untrained.push_back(static_cast<int>(b));
      c.untrained_samples += st.samples_per_bucket[b];
    }
  }
  if (st.num_samples > 0) c.untrained_fraction = static_cast<double>(c.untrained_samples) / st.num_samples;
  return c;
}

std::string bucket_histogram(const Dataset& ds, const EpochPlan& plan) {
  const auto& st = plan.stats();
  std::string out = fmt::format("{:>30} {:>9} {:>7} {:>7}\n", "bucket (base: key -> h x w)", "samples", "batch", "steps");
  for (int b = 0; b < ds.buckets().size(); ++b) {
    const auto i = static_cast<size_t>(b);
    if (i >= st.samples_per_bucket.size() || st.samples_per_bucket[i] == 0) continue;
    const std::string batch = i < st.batch_per_bucket.size() ? std::to_string(st.batch_per_bucket[i]) : "-";
    out += fmt::format("{:>30} {:>9} {:>7} {:>7}\n", ds.buckets().describe(b), st.samples_per_bucket[i], batch,
                       st.steps_per_bucket[i]);
  }
  return out;
}

namespace {
// What cannot train: an error to stop at, or a warning.
void refuse_or_warn(bool refuse, const std::string& what) {
  if (refuse) throw UsageError(what, "config error");
  log::warn_shared("{}", what);
}
}  // namespace

void check_plan_coverage(const Dataset& ds, const EpochPlan& plan, const std::string& who, bool refuse) {
  const DatasetOptions& o = ds.options();
  const char* batch_key = o.batch.batch_tokens > 0 ? "train.batch_tokens" : "train.global_batch_size";
  const auto& st = plan.stats();
  if (st.num_samples == 0) {
    refuse_or_warn(refuse, fmt::format("{}: data.data_dir {} holds no sample; check the paths (sana-train index "
                                       "lists what it finds)",
                                       who, fmt::join(o.sources, ", ")));
    return;
  }
  if (ds.unreadable() == st.num_samples) {
    refuse_or_warn(refuse, fmt::format("{}: no usable sample: none of the {} files in data.data_dir {} has a "
                                       "readable image header; run sana-train check-data to see why",
                                       who, st.num_samples, fmt::join(o.sources, ", ")));
    return;
  }
  const auto c = plan_coverage(plan);
  if (plan.steps() == 0) {
    refuse_or_warn(refuse, fmt::format("{}: no training step: every bucket holds fewer samples than its global "
                                       "batch ({}) and data.tail is {}:\n{}Use data.tail: pad, a smaller {}, or "
                                       "more data",
                                       who, o.batch.describe(), tail_name(o.tail),
                                       bucket_histogram(ds, plan), batch_key));
    return;
  }
  if (st.padded > 0) {
    log::info("{}: data.tail pad repeats {} sample{} per epoch to fill the buckets' last global batches", who,
              st.padded, st.padded == 1 ? "" : "s");
  }
  if (c.untrained.empty()) return;
  std::string names;
  for (int b : c.untrained) {
    names += fmt::format("{}{} ({} sample{})", names.empty() ? "" : ", ", ds.buckets().describe(b),
                         st.samples_per_bucket[static_cast<size_t>(b)],
                         st.samples_per_bucket[static_cast<size_t>(b)] == 1 ? "" : "s");
  }
  const std::string what = fmt::format(
      "{} bucket{} never train{}: {}; {} of {} samples ({:.1f}%) that no epoch will see, since each holds fewer "
      "samples than its global batch and data.tail is drop",
      c.untrained.size(), c.untrained.size() == 1 ? "" : "s", c.untrained.size() == 1 ? "s" : "", names,
      c.untrained_samples, st.num_samples, 100.0 * c.untrained_fraction);
  if (c.untrained_fraction > o.max_untrained_fraction) {
    refuse_or_warn(refuse, fmt::format("{}: {}, more than data.max_untrained_fraction {}:\n{}Use data.tail: pad, a "
                                       "smaller {}, or raise data.max_untrained_fraction",
                                       who, what, o.max_untrained_fraction, bucket_histogram(ds, plan), batch_key));
    return;
  }
  log::warn_shared("{}: {} (data.tail: pad would train them)", who, what);
}

}  // namespace sana::data
