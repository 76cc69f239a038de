#include "sana/train/optim/lr_curve.h"

#include <algorithm>
#include <cmath>

namespace sana::train {

double peak_learning_rate(const LrScheduleOptions& t) {
  using Scaling = LrScheduleOptions::BatchScaling;
  double lr = t.lr;
  const double ratio = static_cast<double>(t.global_batch_size) / 256.0;
  if (t.auto_lr == Scaling::sqrt) lr *= std::sqrt(ratio);
  if (t.auto_lr == Scaling::linear) lr *= ratio;
  return lr;
}

// diffusers' schedules (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup)
// and upstream's get_cosine_decay_to_constant_with_warmup, as multipliers of the peak rate at
// optimizer step `step` (the number of steps already taken: warmup starts at 0).
double learning_rate(const LrScheduleOptions& t, int64_t step, int64_t total_steps) {
  using Shape = LrScheduleOptions::Shape;
  const double peak = peak_learning_rate(t);
  const int64_t warmup = t.num_warmup_steps;
  const double k = static_cast<double>(step);
  if (step < warmup) return peak * k / static_cast<double>(std::max<int64_t>(1, warmup));
  if (t.lr_schedule == Shape::constant) return peak;
  const auto half_waves = [&](int64_t horizon) {
    const double progress = (k - static_cast<double>(warmup)) / static_cast<double>(std::max<int64_t>(1, horizon - warmup));
    return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * t.num_cycles * 2.0 * progress)));
  };
  if (t.lr_schedule == Shape::cosine) return peak * half_waves(total_steps);
  // Upstream's floor is 1 / the auto_lr scale: the decay ends at train.optimizer.lr unscaled.
  const double final_ratio = t.final_lr_ratio > 0 ? t.final_lr_ratio : std::min(1.0, t.lr / peak);
  const auto decay_steps = static_cast<int64_t>(static_cast<double>(total_steps) * t.num_decay);
  if (step > decay_steps) return peak * final_ratio;
  return peak * (half_waves(decay_steps) * (1.0 - final_ratio) + final_ratio);
}

}  // namespace sana::train
