#include "sana/train/input/data_guards.h"

#include <fmt/format.h>

namespace sana::train {

void agree_on_epoch_plan(dist::Runtime& rt, const data::EpochPlan& plan) {
  rt.agree(fmt::format("epoch {} plan (steps and fingerprint)", plan.epoch()),
           fmt::format("{} steps, {}", plan.steps(), plan.fingerprint()));
}

void BadSampleGuard::add(const data::Batch& batch) {
  bad_ += static_cast<int64_t>(batch.bad_reasons.size());
  reads_ += batch.reads;
}

void BadSampleGuard::check(dist::Runtime& rt) {
  // One all-reduce of (bad, read) so every rank sees the same totals and decides alike.
  auto t = torch::tensor({static_cast<double>(bad_), static_cast<double>(reads_)},
                         torch::dtype(torch::kFloat64).device(rt.device()));
  rt.all_reduce(t);
  decide(t[0].item<double>(), t[1].item<double>());
}

void BadSampleGuard::decide(double total_bad, double total) {
  total_bad_ = static_cast<int64_t>(total_bad);
  total_reads_ = static_cast<int64_t>(total);
  if (total >= static_cast<double>(min_reads_) && total_bad / total > max_fraction_) {
    throw TooManyBadSamples(fmt::format(
        "{:.0f} of {:.0f} samples read on all ranks were bad ({:.2f}%, more than "
        "data.max_bad_fraction {}); every rank stops here. Run sana-train check-data to list "
        "them",
        total_bad, total, 100.0 * total_bad / total, max_fraction_));
  }
}

}  // namespace sana::train
