// The step's agreement: what every rank must decide the same way after a step, carried
// by one small all-reduce (non-finite anywhere, the loss, bad samples and reads, the squared
// gradient norm, and one "stop requested" slot per rank so everyone can name who asked, and
// why). Its read after the all-reduce is the step's one wait for the device: the loss and the
// norm are added into their slots on the device (kLossSlot, ...) before it. The packing and
// the decisions are pure functions, so they are tested without processes; NonfinitePolicy
// owns the skip counters that a checkpoint carries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sana/util/stateful.h"

namespace sana::train {

// What this rank saw in its part of the step.
struct LocalStep {
  double loss = 0;       // this rank's part of the loss (its samples' losses / the global batch)
  double grad_norm = 0;  // of the synced gradient: equal on every rank (this rank's part under ZeRO 2)
  double bad = 0, reads = 0;  // this rank's running bad-sample and read counts
  bool stop_requested = false;  // SIGINT/SIGTERM
  bool out_of_time = false;     // train.early_stop_hours have passed on this rank
  // ZeRO stage 2: the squares of this rank's gradient segments summed; 0 otherwise.
  double grad_square_part = 0;
  // Otherwise the squared norm of the whole synced gradient, on rank 0 alone (0 on the
  // others): its sum over ranks is rank 0's figure exactly.
  double grad_square_whole = 0;
};

// The slots of pack_step()'s vector that the trainer fills on the device (trainer.cpp's
// agree_on_step): 1 where this rank's loss or gradient norm is not finite, the loss, and the
// squared norms. The rest (bad samples, reads, stop requests) are the host's.
constexpr size_t kNonfiniteSlot = 0, kLossSlot = 1, kSquarePartSlot = 4, kSquareWholeSlot = 5;

// What every rank concludes from the sums.
struct StepVerdict {
  bool nonfinite = false;      // some rank's loss or gradient norm is not finite
  double loss_mean = 0;        // the global batch's mean (the parts summed)
  double total_bad = 0, total_reads = 0;
  double grad_square_sum = 0;   // the ranks' grad_square_part summed: the squared global norm
  double grad_square_whole = 0; // rank 0's grad_square_whole: the squared global norm outside ZeRO 2
  std::vector<int> stop_ranks;  // ranks that asked to stop (a signal, or out of time)
  bool out_of_time = false;     // some of them for train.early_stop_hours
  bool stop_requested() const { return !stop_ranks.empty(); }
};

// The vector this rank contributes to the sum: 6 + world_size numbers.
std::vector<double> pack_step(const LocalStep& mine, int rank, int world_size);
// The verdict from the element-wise sum of every rank's pack_step().
StepVerdict decide_step(const std::vector<double>& sums, int world_size);

// Non-finite steps are skipped on every rank; too many in a row stop the run.
// A stateful part ("nonfinite"): checkpoints carry the run's skip count.
class NonfinitePolicy : public Stateful {
 public:
  explicit NonfinitePolicy(int64_t max_in_a_row) : max_in_a_row_(max_in_a_row) {}
  // After a step's verdict: false when the step must be skipped (and said so); throws
  // RunError after more than max_in_a_row skips in a row. `global_step` is the step's
  // number from 1, for the messages.
  bool accept(bool nonfinite, int64_t global_step);
  int64_t skipped() const { return skipped_; }
  int64_t in_a_row() const { return in_a_row_; }
  // Checkpoints carry the run's skip count.
  std::string state_name() const override { return "nonfinite"; }
  PartState save_state() const override { return {{{"skipped_steps", skipped_}}, std::nullopt, {}}; }
  void restore_state(const PartState* saved, const std::string& /*source*/) override {
    if (saved != nullptr) skipped_ = saved->json.value("skipped_steps", int64_t{0});
  }

 private:
  int64_t max_in_a_row_;
  int64_t skipped_ = 0;
  int64_t in_a_row_ = 0;
};

}  // namespace sana::train
