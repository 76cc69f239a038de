// SANA-Sprint's stage 2 inside the training run (docs/sprint.md): what a run of a SanaMSCM
// student with model.teacher_model adds to a flow run. It owns the frozen teacher, the
// discriminator heads with their reducer, optimizer and checkpoint parts, and the step
// (train/sprint_step.h); the trainer keeps the student, its reducer, optimizer, schedule and
// EMA as in any run. Steps alternate by the run's global step, as upstream's global_step
// (both phases count): even steps train the student (the generator), odd ones the heads.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sana/data/loader.h"
#include "sana/distributed/runtime.h"
#include "sana/model/ladd_heads.h"
#include "sana/model/sana_ms.h"
#include "sana/model/storage_dtype.h"
#include "sana/model/weights.h"
#include "sana/parallel/options.h"
#include "sana/parallel/reducer.h"
#include "sana/train/data_guards.h"
#include "sana/train/optim.h"
#include "sana/train/sprint_step.h"
#include "sana/train/step.h"

namespace sana::train {

// The phases' named losses of one step, summed over ranks: {"loss_scm", "loss_adv"} after a
// generator step, {"loss_D", "loss_D_real", "loss_D_fake"} after a discriminator step.
using PhaseLosses = std::vector<std::pair<std::string, double>>;

// What stage 2 adds, by the keys' names (train/part_options.h fills it).
struct SprintTrainingOptions {
  model::ModelSpec teacher;         // model.teacher (else model.model) without the student's additions
  std::string teacher_model;        // model.teacher_model: its weights
  model::StorageDtype frozen_dtype = model::StorageDtype::fp32;  // train.frozen_base_dtype: the teacher's layers
  uint64_t seed = 0;                // train.seed: the heads' initial weights
  SprintOptions step;               // the objective (scheduler.*, train.* Sprint keys, the heads' blocks)
  parallel::ReducerOptions reducer;  // ddp.*, train.deterministic: the heads' gradients (summed over ranks)
  OptimizerOptions optimizer;       // train.optimizer: the heads' (upstream's optimizer_D is built from it)
  int64_t micro_batch_size = 0;     // train.micro_batch_size: train.deterministic's shares (rank_share_whole)
};

class SprintTraining {
 public:
  // Builds the teacher (its weights, frozen, in frozen_dtype), the heads (initial weights
  // from the seed, the same on every rank), their reducer and optimizer. Collective: the
  // ranks agree on the teacher's checksum.
  SprintTraining(SprintTrainingOptions options, model::SanaMS student, dist::Runtime& rt);

  static bool generator_phase(int64_t global_step) { return SprintStep::generator_phase(global_step); }

  // Step `global_step` (from 0) on this rank's share: its micro-batches read through `step`
  // (TrainStep::prepare), then the phase's forwards and backwards with the gradients synced
  // by the phase's reducer (`student_reducer`, or the heads'). Collective. out.loss_sum is
  // this rank's part of the phase's total loss; `losses` gets the phase's named parts.
  StepOutput run(TrainStep& step, data::Loader& loader, int64_t epoch, int64_t step_in_epoch, int64_t global_step,
                 BadSampleGuard& guard, parallel::Reducer& student_reducer, PhaseLosses& losses);

  parallel::Reducer& heads_reducer() { return *heads_reducer_; }
  Optimizer& heads_optimizer() { return *heads_optimizer_; }
  // The checkpoint parts: the heads' weights ("discriminator"), their optimizer state
  // ("discriminator_optimizer") and their reducer's (train.deterministic's scales:
  // "discriminator_reducer").
  std::vector<Stateful*> parts();
  // "teacher SanaMSCM_tiny_P2_D4 (0.94 M, from T), 2 discriminator heads on blocks 1, 3 (0.33 M)".
  std::string describe() const;
  // The heads' weights' checksum (every rank's must agree at the end).
  std::string heads_checksum() const;

 private:
  // The share's x0 of the sample before this rank's first, cyclically, gathered from the
  // rank before (one all-reduce of a [W, 1, C, H, W] tensor).
  torch::Tensor previous_x0(const SprintShare& share, dist::Runtime& rt) const;
  // The phase's forwards and backwards, then the reducer's sums; under train.deterministic
  // again (the heads' power iteration undone first) while the integer sums overflow.
  SprintLosses run_phase(const SprintShare& share, parallel::Reducer& reducer, StepOutput& out,
                         const model::AutocastState& autocast);

  dist::Runtime& rt_;
  model::SanaMS teacher_{nullptr};
  model::LaddHeads heads_{nullptr};
  std::string teacher_source_;
  std::unique_ptr<parallel::Reducer> heads_reducer_;
  std::unique_ptr<Optimizer> heads_optimizer_;
  std::unique_ptr<model::ModuleState> heads_part_;
  std::unique_ptr<Stateful> optimizer_part_, reducer_part_;
  int64_t micro_batch_size_ = 0;
  bool exact_ = false;
  std::unique_ptr<SprintStep> step_;
};

}  // namespace sana::train
