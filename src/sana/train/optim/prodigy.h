// Prodigy (Mishchenko and Defazio 2023, "Prodigy: An Expeditiously Adaptive Parameter-Free
// Learner") as the prodigyopt package computes it (prodigyopt.Prodigy, pinned in
// python/requirements.lock), with its hyper-parameters and defaults: betas (0.9, 0.999), beta3
// sqrt(beta2), eps 1e-8, weight decay 0 decoupled, no bias correction, no safeguard_warmup,
// d0 1e-6, d_coef 1, growth_rate unbounded, slice_p 1. The learning rate scales the step
// size d it estimates (leave it at 1, as prodigyopt says; the trainer's default for it).
//
// Per step at rate lr, with D = d lr (times sqrt(1 - b2^(k+1)) / (1 - b1^(k+1)) under
// use_bias_correction), over every parameter p with gradient g (p0 its first value, every
// slice_p-th element of s, p0 and g taken):
//   numerator = b3 numerator + (d / d0) D sum <g, p0 - p>
//   m = b1 m + d (1 - b1) g,  v = b2 v + d^2 (1 - b2) g^2
//   s = b3 s + (d / d0) (safeguard_warmup ? d : D) g,  denominator = sum |s|_1
//   d = max(d, d_coef numerator / denominator) at the first growth, d_max likewise, then
//   d = min(d_max, d growth_rate)
//   p = p - weight_decay D p - D m / (sqrt(v) + d eps)   (with the new d)
// The two sums run over the whole model: with ZeRO each rank holds some parameters, and
// sum_parameters_with() adds every rank's numbers in one fixed order, so that every world
// size takes the same steps. prodigyopt's global numbers (d, d_max, the numerator, k) are
// kept in every parameter's state as "<param>/d" and so on (fp64), so that any rank
// resuming any parameter has them; prodigyopt stores a zero p0 as a scalar, this one keeps
// its shape.
#pragma once

#include <torch/torch.h>

#include <limits>
#include <vector>

#include "sana/train/optim/optimizer.h"

namespace sana::train {

struct ProdigyOptions {
  std::vector<double> betas{0.9, 0.999};  // a third value: beta3 (else sqrt(beta2))
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decouple = true;
  bool use_bias_correction = false;
  bool safeguard_warmup = false;
  double d0 = 1e-6;
  double d_coef = 1.0;
  double growth_rate = std::numeric_limits<double>::infinity();
  int64_t slice_p = 1;
};

class Prodigy : public StatefulOptimizer {
 public:
  Prodigy(NamedParams params, ProdigyOptions o);
  void apply(double lr) override;
  const char* name() const override { return "Prodigy"; }
  NamedParams state() const override;
  void load_state(const NamedParams& state) override;
  void sum_parameters_with(SumOverParameters sum) override { sum_ = std::move(sum); }
  double d() const { return d_; }

 private:
  // Every parameter's two numbers this step (rows: <g, p0 - p> and |s|_1 after its update,
  // fp64 on the host), the moments updated on the way.
  torch::Tensor first_pass(double lr, double dlr);
  ProdigyOptions o_;
  double beta3_;
  // prodigyopt's param-group numbers: the same on every rank.
  double d_, d_max_, numerator_ = 0.0;
  int64_t k_ = 0;
  SumOverParameters sum_;
};

}  // namespace sana::train
