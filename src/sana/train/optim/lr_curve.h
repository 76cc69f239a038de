// The learning rate at each optimizer step, as upstream schedules it: diffusers' constant
// and cosine schedules with warmup, upstream's cosine decaying to a constant floor, and the
// peak rate optionally scaled by the global batch (train.auto_lr). No torch.
#pragma once

#include <cstdint>

namespace sana::train {

// train.optimizer.lr, train.lr_schedule and lr_schedule_args, train.auto_lr and the global
// batch, by their keys' names (train/options/torch_options.h fills them from the config).
struct LrScheduleOptions {
  enum class Shape { constant, cosine, cosine_decay_to_constant };
  enum class BatchScaling { none, sqrt, linear };
  double lr = 1e-4;                 // train.optimizer.lr
  Shape lr_schedule = Shape::constant;
  BatchScaling auto_lr = BatchScaling::none;
  int64_t global_batch_size = 256;  // what auto_lr scales by (against 256)
  int64_t num_warmup_steps = 0;
  double final_lr_ratio = 0.0;      // cosine_decay_to_constant's floor; 0: 1 / the auto_lr scale
  double num_decay = 0.667;         // cosine_decay_to_constant: the share of the steps it decays over
  double num_cycles = 0.5;          // cosine: half-waves over the run
};

// train.optimizer.lr, times sqrt (or all) of global_batch_size / 256 under train.auto_lr.
double peak_learning_rate(const LrScheduleOptions& o);
// The rate at optimizer step `step` (from 0) of `total_steps`.
double learning_rate(const LrScheduleOptions& o, int64_t step, int64_t total_steps);

}  // namespace sana::train
