// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") as the lion-pytorch
// package computes it (lion_pytorch.Lion, its defaults betas (0.9, 0.99), weight decay 0; no
// eps). One moment per parameter, in the parameter's dtype (fp32); per step, in this order:
//   p = p (1 - lr wd)                              (decoupled weight decay)
//   p = p - lr sign(b1 m + (1 - b1) g)             (the update: every element moves by lr)
//   m = b2 m + (1 - b2) g
// Checkpoints hold "<param>/exp_avg" and "<param>/step" (lion-pytorch keeps no step; ours
// counts steps as every optimizer here does).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "sana/train/optim/optimizer.h"

namespace sana::train {

class Lion : public StatefulOptimizer {
 public:
  Lion(NamedParams params, std::vector<double> betas, double weight_decay);
  void apply(double lr) override;
  const char* name() const override { return "Lion"; }

 private:
  double beta1_, beta2_, weight_decay_;
};

}  // namespace sana::train
