// Optimizers and learning-rate schedules, as upstream configures them: AdamW (torch's)
// and CAME (confidence-guided adaptive memory efficient optimisation: factored second
// moments for 2-D weights and 1x1 convolutions, upstream's default for Sana), constant
// with warmup, cosine, cosine decaying to a constant floor, and optional sqrt scaling of
// the learning rate by the global batch.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "sana/config/config.h"

namespace sana::train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;  // uses each parameter's .grad
  virtual const char* name() const = 0;
};

std::unique_ptr<Optimizer> make_optimizer(const config::OptimizerConfig& cfg,
                                          const std::vector<torch::Tensor>& params);

// train.optimizer.lr, times sqrt(global_batch_size / 256) when train.auto_lr is "sqrt".
double peak_learning_rate(const config::TrainConfig& t);
// The rate at optimizer step `step` (from 0) of `total_steps`.
double learning_rate(const config::TrainConfig& t, int64_t step, int64_t total_steps);

// CAME, exposed for its tests.
class Came : public Optimizer {
 public:
  Came(std::vector<torch::Tensor> params, std::vector<double> betas, std::vector<double> eps,
       double weight_decay, double clip_threshold = 1.0);
  void step(double lr) override;
  const char* name() const override { return "CAME"; }
  // Whether a parameter of this shape keeps factored (row, column) statistics.
  static bool factored(at::IntArrayRef shape);

 private:
  struct State {
    int64_t step = 0;
    torch::Tensor exp_avg, exp_avg_sq, row, col, res_row, res_col;
  };
  std::vector<torch::Tensor> params_;
  std::vector<State> state_;
  double beta1_, beta2_, beta3_, eps1_, eps2_, weight_decay_, clip_;
};

}  // namespace sana::train
