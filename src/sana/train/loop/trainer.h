// The training run: `sana-train --config C` on one or many processes. Every rank builds
// the same epoch plan and the same model (rank 0's weights broadcast and fingerprinted),
// and each step goes through the same parts in the same order (Trainer::start builds them,
// Trainer::run reads as the list): the rank's micro-batches forward and backward (TrainStep, the reducer syncing
// gradients), the step agreement (one small all-reduce: loss, bad samples, non-finite,
// stop requests), the optimizer and schedule, the EMA, Metrics, Previews and the
// Checkpointer. A failing rank makes the others exit through the runtime's failure watch.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sana/config/config.h"
#include "sana/data/dataset.h"
#include "sana/distributed/launch_env.h"
#include "sana/distributed/runtime.h"
#include "sana/train/checkpoint/checkpointer.h"
#include "sana/train/checkpoint/run_state.h"
#include "sana/train/elastic/continuation.h"
#include "sana/train/input/run_input.h"
#include "sana/train/loop/step_agreement.h"
#include "sana/train/loop/stop_requests.h"
#include "sana/train/loop/update.h"
#include "sana/train/previews/evaluation.h"
#include "sana/train/report/memory_use.h"
#include "sana/train/report/reporting.h"
#include "sana/train/step/train_step.h"
#include "sana/train/step/training_step.h"
#include "sana/train/train.h"
#include "sana/train/trainable/trained_model.h"

namespace sana::train {

class Trainer {
 public:
  // Builds the run's parts (start()): collectives, so every rank constructs its Trainer.
  // `elastic`: the group's layer under dist.elastic continue (elastic/continuation.h), for
  // this trainer; its state comes from rank 0's there (a group that just took in a
  // replacement or lost a rank) instead of resume_from when it says so. `hooks`: the
  // tests' fault injection (off in production runs).
  Trainer(const config::Config& cfg, dist::Runtime& rt, const TestHooks& hooks, Continuation& elastic);
  // The whole run: every epoch's steps, then the end (final previews, the cross-rank
  // weight check, weights, report). false: it stopped without the end, after a step that
  // took in a replacement (Runtime::joining), or after a loss the group could not take in
  // place (Continuation::regroup); `elastic` then hands the state over to a new Trainer.
  bool run();
  int64_t global_step() const { return run_.position().global_step; }

 private:
  // The start-up sequence: every part built in the order every rank must build it, each
  // collective visible there. The members below only hold what it builds.
  void start();
  bool main_rank() const { return rt_.rank() == 0; }  // the group's rank 0: metrics, checkpoints, the report
  // start()'s parts by concept: the training set (its cache and bad-sample guard), the
  // model (its encoders, control maps, class images and what of it trains), the update's
  // parts, and the reporting.
  void open_training_set();
  void build_model();
  void build_update();
  void start_reporting();
  void register_checkpointed_parts();
  void resume();
  // from_peers: the state rank 0 shares (collective), restored as a resume would.
  void resume_from_peers();
  // The position a restored `saved` state sets (RunState::continue_at), and a change of
  // batch since.
  void continue_at(const ckpt::TrainerState& saved);
  void use_empty_prompt();
  void log_start() const;
  double device_peak_flops() const;
  void log_config_changes(const ckpt::TrainerState& saved) const;
  // A resume with another train.global_batch_size or batch_tokens: the epoch's unseen
  // samples re-batched.
  void change_batch(const ckpt::TrainerState& saved);
  // A fresh start (resume_from latest finding none) from model.load_from's checkpoint folder:
  // its optimizer state (train.load_from_optimizer) and schedule position
  // (train.load_from_lr_scheduler), as upstream's train.py.
  void carry_over_load_from();
  // train.eval: opens the held-out samples (a collective); nothing when it is off.
  void open_eval_set();
  // The parts built for the group's ranks, built for the group re-formed in place (a collective).
  void follow_group();
  void open_class_images();
  // After step `global_step`: the previews due (ending epoch `epoch` when `epoch_end`) and
  // the held-out loss (train.eval), with the whole model under ZeRO stage 3. Collective.
  void preview_and_evaluate(int64_t global_step, bool epoch_end, int64_t epoch);
  // After a resume: train.resume_lr_scheduler false restarts the schedule (a named checkpoint only).
  void restart_schedule_if_asked();
  // What this rank's loaders read with (a training epoch's, the held-out set's).
  data::LoaderOptions loader_options() const;
  // Epoch `epoch`'s plan: data.sampler's; for the epoch in progress with its parts unless
  // `fresh` (what a whole epoch is).
  data::EpochPlan epoch_plan(int64_t epoch, bool fresh = false) const;
  // The steps the run will take: the current epoch's plan, then whole epochs, max_steps.
  int64_t count_total_steps() const;
  bool run_epoch(int64_t epoch);  // false: stopped on request
  bool train_step(data::Loader& loader, int64_t epoch, int64_t step, int64_t steps_in_epoch);
  // After this process's first step: what each rank holds (report/memory_use.h), gathered
  // (a collective) and written to work_dir/memory.json by rank 0. `activations`: the
  // peak's rise during the step's forward and backward (`step`).
  void report_memory(const PeakProbe& activations, const StepOutput& step);
  // The step's agreement and, when every rank accepts it, the update of what the step trains
  // (`own`: a target of the kind of training's own; none: the Trainable).
  struct Outcome {
    StepVerdict verdict;
    double grad_norm = 0;
    bool applied = false;
  };
  Outcome agree_and_update(StepOutput& out, double lr, double scale, const std::optional<OwnTarget>& own);
  // The step's agreement (one all-reduce): the loss, bad samples and stop requests of all
  // ranks; gradients are equal on every rank by then, and so is their norm.
  // `square_and_loss`: grad_square_and_loss()'s, still on the device; `parts`: ZeRO 2's
  // gradient segments (each rank has its part of the squares).
  StepVerdict agree_on_step(const torch::Tensor& square_and_loss, bool parts);
  // The step's figures for the metrics, after its update (run_ counts it). `has_loss`:
  // the step trained the Trainable (its loss is the run's).
  StepRecord step_record(int64_t epoch, int64_t step, const Outcome& o, double lr, const StepOutput& out,
                         bool has_loss, PhaseLosses figures) const;
  // The run's position and metadata, as the checkpoint's trainer_state.json holds them.
  ckpt::TrainerState run_state() const;
  void finish();

  const config::Config& cfg_;
  dist::Runtime& rt_;
  const TestHooks& hooks_;
  // The run's parts, in start()'s order.
  RunInput input_;
  TrainedModel model_;
  Update update_;  // the reducer, ZeRO, the optimizer, the EMA, the scaler, the schedule
  std::optional<TrainStep> step_;
  // The kind of training (step/training_step.h): flow matching, SANA-Sprint's stage 2, ...
  std::unique_ptr<TrainingStep> kind_;
  Evaluation evaluation_;  // previews and the held-out loss
  std::optional<Checkpointer> checkpointer_;
  Reporting report_;
  // Where the run stands: the position, the epoch in progress's batch segments, the steps it takes.
  RunState run_;
  // dist.elastic continue for this trainer: where its state comes from, the share mirror,
  // a loss met after a step's commit, a replacement coming in, a regroup.
  Continuation& elastic_;
  StopRequests stops_;  // SIGINT, SIGTERM, train.early_stop_hours
};

// train.micro_batch_size auto (config/config.h): `cfg` with the micro-batch and gradient
// checkpointing `sana-train model --device-memory` suggests for the smallest memory budget
// among the group's ranks (train/report/micro_batch.h), auto replaced by them. A collective:
// every rank gives its budget, rank 0 measures the activations and decides, every rank
// takes its decision (trainer_micro_batch.cpp). Without auto, `cfg` as it is.
config::Config with_micro_batch_chosen(const config::Config& cfg, dist::Runtime& rt);

}  // namespace sana::train
