// What a step's gradients go through once every rank has accepted the step, as
// Trainer::start builds it: the reducer that synced them, ZeRO's share of the state, the
// optimizer, the EMA, the loss scaler, the policy on non-finite steps and the
// learning-rate schedule; and the checkpoint parts of the trained state as ZeRO keeps them.
//
// Owns: those parts and the order of an update (unscale and clip, the EMA, the optimizer
// with ZeRO's post-step, the mirror's copy of it under dist.elastic continue).
// Never: agrees on a step (the step agreement does) or moves the run's position.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sana/parallel/reducer.h"
#include "sana/parallel/sharded_checkpoint.h"
#include "sana/parallel/zero.h"
#include "sana/train/elastic/continuation.h"
#include "sana/train/loop/step_agreement.h"
#include "sana/train/optim/ema.h"
#include "sana/train/optim/loss_scaler.h"
#include "sana/train/optim/lr_scheduler.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/step/training_step.h"

namespace sana::train {

struct Update {
  std::unique_ptr<parallel::Reducer> reducer;
  std::optional<parallel::Zero> zero;  // what this rank keeps (train.zero_stage)
  std::unique_ptr<Optimizer> optimizer;
  std::optional<Ema> ema;
  std::optional<NonfinitePolicy> nonfinite;
  std::optional<LossScaler> scaler;
  std::optional<LrScheduler> lr_scheduler;  // train.optimizer.lr and the schedule keys; where it stands
  // The trained weights', the EMA's and the optimizer's checkpoint parts, as ZeRO keeps them.
  std::optional<parallel::ShardedState> sharded;

  // Step `step` (from 1), agreed as `verdict`, its gradients' norm `grad_norm` at loss
  // scale `scale`: applied unless an fp16 overflow or the non-finite policy skips it, at
  // `lr`, clipped to `clip` (train.gradient_clip). `own`: the kind of training's own target
  // (its optimizer, no EMA); none: the Trainable. `elastic` takes the step onto the mirror.
  // Every gradient is zeroed after it. Returns whether it was applied.
  // Who writes and reads each entry of a format-3 checkpoint in the group (ZeRO's owners;
  // `timeout_s`: dist.timeout_s). A collective.
  std::unique_ptr<parallel::ShardedCheckpoints> checkpoint_roles(dist::Runtime& rt, double timeout_s) const;

  bool apply(const StepVerdict& verdict, int64_t step, double grad_norm, double lr, double scale, double clip,
             const std::optional<OwnTarget>& own, Continuation& elastic);
};

// The optimizer's evaluation weights (schedule-free's x, Optimizer::eval_weights) in the
// trained parameters while it lives: for previews, the held-out loss and the run's final
// files. Each rank sets the parameters it updates and ZeRO shares them as after a step;
// the training weights (y) come back to the last bit at restore(). Nothing for an
// optimizer without them. Made before a parallel::Zero::Whole at stage 3, so that the
// gathered model holds them, and restored after it.
class EvalWeights {
 public:
  explicit EvalWeights(Update& update);  // a collective at ZeRO stages 1 and 2
  // The training weights back on every rank (a collective at stages 1 and 2).
  void restore();
  // Without restore() (an exception on the way): this rank's own parameters back.
  ~EvalWeights();
  EvalWeights(const EvalWeights&) = delete;
  EvalWeights& operator=(const EvalWeights&) = delete;

 private:
  Update& update_;
  void put_back();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> kept_;  // a parameter and its training value (host)
};

}  // namespace sana::train
