// SANA-Sprint's stage 2 as a kind of training (step/training_step.h; docs/sprint.md): a
// SanaMSCM student distilling model.teacher_model. Steps alternate by the run's global step,
// as upstream's global_step (both phases count): even steps train the student (the
// generator: the run's Trainable, through the loop's reducer, optimizer, schedule and EMA),
// odd ones the discriminator heads (an own target: their reducer and optimizer, no schedule).
//
// Owns: the frozen teacher, the discriminator heads with their reducer, optimizer and
// checkpoint parts, and the objective (sprint/objective.h).
// Never: updates the student, or reads the config (torch_options.cpp's
// sprint_step_options_for fills its options).
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
#include "sana/train/input/data_guards.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/sprint/objective.h"
#include "sana/train/step/train_step.h"
#include "sana/train/step/training_step.h"

namespace sana::train {

// What stage 2 adds, by the keys' names (train/options/torch_options.h's sprint_step_options_for fills it).
struct SprintStepOptions {
  model::ModelSpec teacher;         // model.teacher (else model.model) without the student's additions
  std::string teacher_model;        // model.teacher_model: its weights
  model::StorageDtype frozen_dtype = model::StorageDtype::fp32;  // train.frozen_base_dtype: the teacher's layers
  uint64_t seed = 0;                // train.seed: the heads' initial weights
  SprintOptions step;               // the objective (scheduler.*, train.* Sprint keys, the heads' blocks)
  parallel::ReducerOptions reducer;  // ddp.*, train.deterministic: the heads' gradients (summed over ranks)
  OptimizerOptions optimizer;       // train.optimizer: the heads' (upstream's optimizer_D is built from it)
  int64_t micro_batch_size = 0;     // train.micro_batch_size: train.deterministic's shares (rank_share_whole)
};

class SprintStep : public TrainingStep {
 public:
  // Builds the teacher (its weights, frozen, in frozen_dtype), the heads (initial weights
  // from the seed, the same on every rank), their reducer and optimizer; `parts.reducer` is
  // the student's. Collective: the ranks agree on the teacher's checksum.
  SprintStep(SprintStepOptions options, StepParts& parts);

  static bool generator_phase(int64_t global_step) { return SprintObjective::generator_phase(global_step); }

  // Step at.global_step on this rank's share: its micro-batches read through `micro`
  // (TrainStep::prepare), then the phase's forwards and backwards with the gradients synced
  // by the phase's reducer (the student's, or the heads'). Collective. out.loss_sum is this
  // rank's part of the phase's total loss; `losses` gets the phase's named parts.
  StepOutput run(TrainStep& micro, data::Loader& loader, const StepAt& at, BadSampleGuard& guard,
                 PhaseLosses& losses) override;
  // Odd steps: the heads.
  std::optional<OwnTarget> own_target(int64_t global_step) override;
  void zero_own_gradients() override { heads_reducer_->zero_gradients(); }
  // As upstream, the schedule steps with the generator only (even steps).
  int64_t schedule_position(int64_t global_step, int64_t /*overflows*/) const override { return (global_step + 1) / 2; }
  // The heads' weights ("discriminator"), their optimizer state ("discriminator_optimizer")
  // and their reducer's (train.deterministic's scales: "discriminator_reducer").
  std::vector<Stateful*> parts() override;
  // "SANA-Sprint stage 2 (sCM + LADD): teacher SanaMSCM_tiny_P2_D4 (0.94 M, from T), 2
  // discriminator heads on blocks 1, 3 (0.33 M) ...; even steps train the student, odd ones the heads".
  std::string describe() const override;
  // Its steps are not counted (no FLOP/s, no MFU).
  bool counts_flops() const override { return false; }
  // The heads' weights' checksums agree on every rank.
  void check_agreement(dist::Runtime& rt, int64_t global_step) override;

 private:
  // The share's x0 of the sample before this rank's first, cyclically, gathered from the
  // rank before (one all-reduce of a [W, 1, C, H, W] tensor).
  torch::Tensor previous_x0(const SprintShare& share, dist::Runtime& rt) const;
  // The phase's forwards and backwards, then the reducer's sums; under train.deterministic
  // again (the heads' power iteration undone first) while the integer sums overflow.
  SprintLosses run_phase(const SprintShare& share, parallel::Reducer& reducer, StepOutput& out,
                         const model::AutocastState& autocast);

  dist::Runtime& rt_;
  parallel::Reducer& student_reducer_;
  model::SanaMS teacher_{nullptr};
  model::LaddHeads heads_{nullptr};
  std::string teacher_source_;
  std::unique_ptr<parallel::Reducer> heads_reducer_;
  std::unique_ptr<Optimizer> heads_optimizer_;
  std::unique_ptr<model::ModuleState> heads_part_;
  std::unique_ptr<Stateful> optimizer_part_, reducer_part_;
  int64_t micro_batch_size_ = 0;
  bool exact_ = false;
  std::unique_ptr<SprintObjective> step_;
};

}  // namespace sana::train
