// How the flow-matching objective draws its timesteps (diffusion/flow_matching.h): the
// density of u, the shift, and upstream's integer grid. train/options/core_options.h fills it
// from the scheduler.* keys. No torch.
#pragma once

#include <cstdint>

namespace sana::diffusion {

// scheduler.weighting_scheme: the density u is drawn from.
enum class Weighting { logit_normal, sd3_mode, uniform };

struct TimestepOptions {
  Weighting weighting = Weighting::logit_normal;
  double logit_mean = 0.0;
  double logit_std = 1.0;
  double mode_scale = 1.29;
  double flow_shift = 1.0;
  int64_t train_sampling_steps = 1000;  // the integer grid's size
  // Upstream's grid: t = floor(N u), sigma from the shifted t/N table, the model sees
  // trunc(1000 sigma). false: sigma = shift(u), the model sees 1000 sigma.
  bool integer_grid = true;
};

}  // namespace sana::diffusion
