// The learning-rate schedule as a part of the run (upstream's lr_scheduler): where it
// stands is the optimizer steps taken (those fp16 overflow skipped do not count, as under
// torch's GradScaler) plus an offset that only a restart or a carried-over position sets:
// train.resume_lr_scheduler false starts it again on a named resume; train.load_from_lr_scheduler
// continues model.load_from's checkpoint's. Checkpoints keep the offset (and the position,
// which a later model.load_from reads).
#pragma once

#include <cstdint>
#include <functional>

#include "sana/train/optim/lr_curve.h"
#include "sana/util/stateful.h"

namespace sana::train {

class LrScheduler : public Stateful {
 public:
  // `steps_taken`: the run's optimizer steps so far, less those skipped for overflow.
  LrScheduler(LrScheduleOptions options, std::function<int64_t()> steps_taken)
      : o_(options), steps_taken_(std::move(steps_taken)) {}

  const LrScheduleOptions& options() const { return o_; }
  // The schedule's step: what learning_rate() is evaluated at.
  int64_t position() const { return steps_taken_() + offset_; }
  double rate(int64_t total_steps) const { return learning_rate(o_, position(), total_steps); }
  // The next step is the schedule's step 0 (warm-up again).
  void restart() { offset_ = -steps_taken_(); }
  // The next step is the schedule's step `position`.
  void continue_at(int64_t position) { offset_ = position - steps_taken_(); }

  std::string state_name() const override { return "lr_scheduler"; }
  PartState save_state() const override;
  // A checkpoint written before this part existed: offset 0 (the schedule followed the steps).
  void restore_state(const PartState* saved, const std::string& source) override;

  // The schedule position a checkpoint's next step would have had: its part's, or (written
  // before the part existed) its global step.
  static int64_t saved_position(const PartState* saved, int64_t global_step);

 private:
  LrScheduleOptions o_;
  std::function<int64_t()> steps_taken_;
  int64_t offset_ = 0;
};

}  // namespace sana::train
