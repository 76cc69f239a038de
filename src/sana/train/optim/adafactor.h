// Adafactor (Shazeer and Stern 2018) as transformers computes it (transformers.optimization.
// Adafactor, pinned in python/requirements.lock), with its hyper-parameters and defaults:
// eps (1e-30, 1e-3), clip_threshold 1, decay_rate -0.8, no first moment unless beta1 is
// given, weight decay 0, scale_parameter, relative_step, no warmup_init. Per parameter and
// step t, with g its gradient:
//   rho = relative_step ? min(warmup_init ? 1e-6 t : 1e-2, 1 / sqrt(t)) : lr
//   a   = rho * (scale_parameter ? max(eps2, RMS(p)) : 1)            (the step size)
//   b2  = 1 - t^decay_rate,  u = g^2 + eps1
//   a parameter of 2 or more dimensions keeps the means of u over its last dimension (R,
//   "exp_avg_sq_row") and its second-to-last (C, "exp_avg_sq_col"), each an EMA at b2, and
//   v = (R / mean(R)) outer C; any other keeps v = "exp_avg_sq" itself, an EMA of u.
//   U = g / sqrt(v),  U = a U / max(1, RMS(U) / clip_threshold)
//   with beta1: m = beta1 m + (1 - beta1) U ("exp_avg"), U = m
//   p = p - weight_decay a p - U
// Under relative_step the step size is its own: train.optimizer.lr and the schedule do not
// reach it (the trainer says so at start).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "sana/train/optim/optimizer.h"

namespace sana::train {

struct AdafactorOptions {
  std::vector<double> eps{1e-30, 1e-3};
  double clip_threshold = 1.0;
  double decay_rate = -0.8;
  std::optional<double> beta1;  // none: no first moment
  double weight_decay = 0.0;
  bool scale_parameter = true;
  bool relative_step = true;
  bool warmup_init = false;
};

class Adafactor : public StatefulOptimizer {
 public:
  Adafactor(NamedParams params, AdafactorOptions o);
  void apply(double lr) override;
  const char* name() const override { return "Adafactor"; }
  // Whether a parameter of this shape keeps factored (row, column) statistics: 2 or more
  // dimensions, as transformers decides.
  static bool factored(at::IntArrayRef shape) { return shape.size() >= 2; }

 private:
  // The factored second moment's inverse root, from its row and column statistics.
  static torch::Tensor inverse_root(const torch::Tensor& row, const torch::Tensor& col);
  AdafactorOptions o_;
};

}  // namespace sana::train
