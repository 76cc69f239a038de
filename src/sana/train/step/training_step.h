// A kind of training: what one optimizer step computes on this rank, for the loop
// (train/loop/trainer.h) to agree on across the ranks and apply. One implementation per kind:
// flow matching over the run's Trainable (FlowMatchingStep below: the whole model, LoRA, a
// ControlNet), SANA-Sprint's alternating generator and discriminator phases
// (sprint/sprint_step.h). A new kind is one file and one line in the factory
// (options/torch_options.cpp's training_step_for), or a registration (StepRegistration); the
// loop and the Trainer stay as they are.
//
// Owns: the objective and whatever trains beside the run's Trainable (SANA-Sprint's heads,
// their reducer, optimizer and checkpoint parts).
// Never: updates the Trainable (the loop does: its reducer, optimizer, schedule and EMA),
// reads the config, or writes checkpoints itself (its parts() are registered for it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sana/data/loader.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/parallel/reducer.h"
#include "sana/train/input/data_guards.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/step/train_step.h"
#include "sana/util/stateful.h"

namespace sana::train {

// A step's named parts of its loss, summed over ranks, for the metrics (SANA-Sprint's
// {"loss_G", "loss_scm", "loss_adv"} or {"loss_D", "loss_D_real", "loss_D_fake"}); none for
// flow matching, whose one loss is the step's.
using PhaseLosses = std::vector<std::pair<std::string, double>>;

// Which step the loop takes.
struct StepAt {
  int64_t epoch = 0, step_in_epoch = 0;
  int64_t global_step = 0;  // steps taken before this one
  double loss_scale = 1.0;  // fp16 loss scaling's (1 otherwise): every loss is multiplied by it
};

// What a step trains when it is not the run's Trainable: parameters of the kind's own,
// whose gradients `reducer` syncs and `optimizer` applies at the peak learning rate
// (train.optimizer.lr, auto_lr applied), without the schedule or the EMA.
struct OwnTarget {
  parallel::Reducer& reducer;
  Optimizer& optimizer;
};

class TrainingStep {
 public:
  virtual ~TrainingStep() = default;

  // This rank's share of step `at`, forward and backward, every batch counted by `guard`;
  // after it the gradients of what the step trains are synced on every rank. `micro` reads
  // the micro-batches (onto the device, through the encoders); `losses` gets the step's
  // named parts. A collective. out.loss_sum is this rank's part of the step's loss.
  virtual StepOutput run(TrainStep& micro, data::Loader& loader, const StepAt& at, BadSampleGuard& guard,
                         PhaseLosses& losses) = 0;
  // What step `global_step` (from 0) trains: nothing (the run's Trainable), or a target of
  // the kind's own.
  virtual std::optional<OwnTarget> own_target(int64_t /*global_step*/) { return std::nullopt; }
  // After every step's update, applied or skipped: the own targets' gradients zeroed.
  virtual void zero_own_gradients() {}
  // The learning-rate schedule's position after `global_step` steps of which `overflows`
  // were skipped for fp16 overflow (the schedule does not advance over those, as upstream's).
  virtual int64_t schedule_position(int64_t global_step, int64_t overflows) const { return global_step - overflows; }
  // The kind's own checkpoint parts, registered beside the run's.
  virtual std::vector<Stateful*> parts() { return {}; }
  // The start-up line the kind adds ("" for none).
  virtual std::string describe() const { return ""; }
  // Whether the metrics count the step's FLOPs (train_flops) for FLOP/s and MFU.
  virtual bool counts_flops() const { return true; }
  // At the end of the run: the ranks agree on what the kind trains of its own (a collective;
  // throws dist::Disagreement naming it). Nothing for a kind with none.
  virtual void check_agreement(dist::Runtime& /*rt*/, int64_t /*global_step*/) {}
};

// What a kind is built on: the run's model (the student, for a distillation), the reducer
// of the run's Trainable, the runtime.
struct StepParts {
  model::SanaMS model;
  parallel::Reducer& reducer;
  dist::Runtime& rt;
};

// Flow matching over the run's Trainable: the micro-batches' run (TrainStep::run).
class FlowMatchingStep : public TrainingStep {
 public:
  StepOutput run(TrainStep& micro, data::Loader& loader, const StepAt& at, BadSampleGuard& guard,
                 PhaseLosses& losses) override;
};

// A kind of training made outside the factory (a test's): `make` returns its step for a
// run, or null when the run is not of its kind. While the registration lives, its kind is
// asked before the factory's own (the last registered first). Make it before the run starts.
using StepMaker = std::function<std::unique_ptr<TrainingStep>(StepParts& parts)>;
class StepRegistration {
 public:
  StepRegistration(std::string name, StepMaker make);
  ~StepRegistration();
  StepRegistration(const StepRegistration&) = delete;
  StepRegistration& operator=(const StepRegistration&) = delete;

 private:
  std::string name_;
};
// The registered kinds' step for this run (its name in `name`), or null when none claims it.
std::unique_ptr<TrainingStep> registered_training_step(StepParts& parts, std::string& name);

}  // namespace sana::train
