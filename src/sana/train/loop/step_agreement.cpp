#include "sana/train/loop/step_agreement.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {
// Nonfinite, loss, bad, reads, the gradient squares (a part, the whole); then one stop slot per rank.
constexpr size_t kFixed = 6;
}

std::vector<double> pack_step(const LocalStep& mine, int rank, int world_size) {
  if (rank < 0 || rank >= world_size) throw std::invalid_argument(fmt::format("rank {} of {}", rank, world_size));
  std::vector<double> v(kFixed + static_cast<size_t>(world_size), 0.0);
  v[kNonfiniteSlot] = std::isfinite(mine.loss) && std::isfinite(mine.grad_norm) ? 0.0 : 1.0;
  v[kLossSlot] = mine.loss;
  v[2] = mine.bad;
  v[3] = mine.reads;
  v[kSquarePartSlot] = mine.grad_square_part;
  v[kSquareWholeSlot] = mine.grad_square_whole;
  // The rank's slot: 1 for a signal, 2 for the time limit, 3 for both.
  v[kFixed + static_cast<size_t>(rank)] = (mine.stop_requested ? 1.0 : 0.0) + (mine.out_of_time ? 2.0 : 0.0);
  return v;
}

StepVerdict decide_step(const std::vector<double>& sums, int world_size) {
  if (sums.size() != kFixed + static_cast<size_t>(world_size)) {
    throw std::invalid_argument(fmt::format("step agreement: {} numbers for {} ranks", sums.size(), world_size));
  }
  StepVerdict v;
  v.nonfinite = sums[kNonfiniteSlot] > 0;
  v.loss_mean = sums[kLossSlot];  // each rank's part is already its share of the global batch
  v.total_bad = sums[2];
  v.total_reads = sums[3];
  v.grad_square_sum = sums[kSquarePartSlot];
  v.grad_square_whole = sums[kSquareWholeSlot];
  for (int r = 0; r < world_size; ++r) {
    const double slot = sums[kFixed + static_cast<size_t>(r)];
    if (slot > 0) v.stop_ranks.push_back(r);
    if (slot >= 2) v.out_of_time = true;
  }
  return v;
}

bool NonfinitePolicy::accept(bool nonfinite, int64_t global_step) {
  if (!nonfinite) {
    in_a_row_ = 0;
    return true;
  }
  ++skipped_;
  ++in_a_row_;
  log::warn_shared("step {}: non-finite loss or gradient on some rank; the step is skipped on all ranks "
            "({} in a row, train.max_nonfinite {})",
            global_step, in_a_row_, max_in_a_row_);
  if (in_a_row_ > max_in_a_row_) {
    throw RunError(fmt::format("{} non-finite steps in a row (train.max_nonfinite {}): lower train.optimizer.lr or "
                               "train.gradient_clip, or check the data",
                               in_a_row_, max_in_a_row_));
  }
  return false;
}

}  // namespace sana::train
