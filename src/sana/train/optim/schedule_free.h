// Schedule-free AdamW (Defazio et al. 2024, "The Road Less Scheduled") as the schedulefree
// package computes it (schedulefree.AdamWScheduleFree, pinned in python/requirements.lock),
// with its hyper-parameters and defaults: lr 0.0025, betas (0.9, 0.999), eps 1e-8, weight
// decay 0, warmup_steps 0, r 0, weight_lr_power 2. No learning-rate schedule applies: the
// optimizer warms up by itself and averages its iterates instead of decaying.
//
// Per step k (from 0) at rate lr, sched = min(1, (k + 1) / warmup_steps), lr_k = lr sched,
// lr_max = max(lr_max, lr_k), c = (k + 1)^r lr_max^weight_lr_power / (the sum of those so far),
// over every parameter y with gradient g (z starting at y):
//   v = b2 v + (1 - b2) g^2,  u = g / (sqrt(v / (1 - b2^(k+1))) + eps) + weight_decay y
//   y = lerp(y, z, c) + lr_k (b1 (1 - c) - 1) u,  z = z - lr_k u
// The parameters hold y, where the gradients are taken; the weights to evaluate and to
// export are x = lerp(y, z, 1 - 1/b1) (the package's eval()), which eval_weights() gives.
// The package's per-group numbers (k, lr_max, the weight sum) are kept in every parameter's
// state (fp64 and int64), as Prodigy's are, so that any rank resuming any parameter has them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "sana/train/optim/optimizer.h"

namespace sana::train {

struct ScheduleFreeOptions {
  std::vector<double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  double r = 0.0;
  double weight_lr_power = 2.0;
};

class ScheduleFreeAdamW : public StatefulOptimizer {
 public:
  ScheduleFreeAdamW(NamedParams params, ScheduleFreeOptions o);
  void apply(double lr) override;
  const char* name() const override { return "ScheduleFreeAdamW"; }
  NamedParams state() const override;
  void load_state(const NamedParams& state) override;
  NamedParams eval_weights() const override;
  bool has_eval_weights() const override { return true; }

 private:
  ScheduleFreeOptions o_;
  // The package's param-group numbers: the same on every rank.
  int64_t k_ = 0;
  double lr_max_ = -1.0, weight_sum_ = 0.0;
};

}  // namespace sana::train
