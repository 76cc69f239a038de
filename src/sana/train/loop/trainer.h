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
#include "sana/parallel/reducer.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/train/checkpoint/checkpointer.h"
#include "sana/train/checkpoint/run_state.h"
#include "sana/train/input/data_cache.h"
#include "sana/train/input/data_guards.h"
#include "sana/train/optim/ema.h"
#include "sana/train/previews/eval_loss.h"
#include "sana/train/optim/loss_scaler.h"
#include "sana/train/optim/lr_scheduler.h"
#include "sana/train/report/memory_use.h"
#include "sana/train/report/metrics.h"
#include "sana/train/report/step_profile.h"
#include "sana/train/elastic/continuation.h"
#include "sana/train/elastic/share_mirror.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/previews/previews.h"
#include "sana/train/step/train_step.h"
#include "sana/train/step/training_step.h"
#include "sana/train/step/device_timeline.h"
#include "sana/train/loop/step_agreement.h"
#include "sana/train/train.h"
#include "sana/train/trainable/trainable.h"
#include "sana/parallel/zero.h"

namespace sana::train {

class Trainer {
 public:
  // Builds the run's parts (start()): collectives, so every rank constructs its Trainer.
  // from_peers (dist.elastic continue, a group that just took in a replacement): the run's
  // state comes from rank 0's `carried` (elastic/peer_state.h) instead of resume_from.
  // `hooks`: the tests' fault injection (off in production runs).
  Trainer(const config::Config& cfg, dist::Runtime& rt, const TestHooks& hooks, bool from_peers = false,
          const ckpt::Snapshot* carried = nullptr);
  // The whole run: every epoch's steps, then the end (final previews, the cross-rank
  // weight check, weights, report). false: it stopped without the end, after a step that
  // took in a replacement (Runtime::joining: hand_over(), Runtime::admit() and a new
  // Trainer go on), or when a rank was lost under ZeRO or train.deterministic, or rank 0
  // was (regrouped(): the survivors re-formed; hand_over() and a new Trainer go on).
  bool run();
  // After run() returned false: the run's whole state at the last committed step on the
  // group's rank 0 (its checkpoint write finished first), gathered from every rank's share
  // and, for a lost rank, from its mirror (a collective); nothing on the other ranks.
  std::optional<ckpt::Snapshot> hand_over();
  // run() returned false because a rank was lost (ZeRO, train.deterministic, rank 0): the
  // regroup.
  const std::optional<dist::Runtime::Regrouped>& regrouped() const { return elastic_.regrouped(); }
  // The group this trainer was built for changed (`r`, after step `step`; `rebuild_seconds`
  // since the loss, the regroup's included): the log and metrics.jsonl say so. Below
  // dist.min_world_size after a loss: a checkpoint, then RunError.
  void note_regroup(const dist::Runtime::Regrouped& r, int64_t step, double rebuild_seconds);
  int64_t global_step() const { return run_.position().global_step; }

 private:
  // The start-up sequence: every part built in the order every rank must build it, each
  // collective visible there. The members below only hold what it builds.
  void start();
  void register_checkpointed_parts();
  // Who writes and reads each entry of a format-3 checkpoint in this group (a collective).
  std::unique_ptr<parallel::ShardedCheckpoints> sharded_checkpoints();
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
  void open_class_images();
  // After step `global_step`: the previews due (ending epoch `epoch` when `epoch_end`) and
  // the held-out loss (train.eval), with the whole model under ZeRO stage 3. Collective.
  void preview_and_evaluate(int64_t global_step, bool epoch_end, int64_t epoch);
  // After a resume: train.resume_lr_scheduler false restarts the schedule (a named checkpoint only).
  void restart_schedule_if_asked();
  // Epoch `epoch`'s plan: data.sampler's; for the epoch in progress with its parts unless
  // `fresh` (what a whole epoch is).
  data::EpochPlan epoch_plan(int64_t epoch, bool fresh = false) const;
  // The steps the run will take: the current epoch's plan, then whole epochs, max_steps.
  int64_t count_total_steps() const;
  bool run_epoch(int64_t epoch);  // false: stopped on request
  // dist.elastic continue, after a lost rank (`why`): the survivors re-form (collective).
  // At ZeRO stage 0 with rank 0 kept, in place (true): the parts tied to the group follow
  // (the step's gradients discarded, the step's share, the held-out loader); weights,
  // optimizer, EMA and position stay as the last committed step left them; below
  // dist.min_world_size a checkpoint, then RunError. Else (false, regrouped() set) run()
  // hands the run over to a trainer built for the new group: at ZeRO stages 1-3 (a share
  // to take from its mirror), with train.deterministic (whose integer gradient sums start
  // anew), and when rank 0 was lost (its duties: metrics, checkpoints, the report).
  bool regroup(const std::string& why);
  // The regroup at ZeRO stages 1-3: throws RunError when a lost rank's mirror was lost with
  // it (`before`: the group's members before it).
  void check_mirrors(const std::vector<int>& before, const dist::Runtime::Regrouped& r) const;
  // After a loss left fewer than dist.min_world_size ranks: a checkpoint, then RunError.
  void stop_below_minimum(int64_t step);
  // hand_over()'s state: every part as the group's rank 0 has it, the sharded parts'
  // entries gathered from their owners (and from mirrors of the ranks lost) when the
  // state is sharded.
  std::optional<ckpt::Snapshot> whole_state();
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
  // train.early_stop_hours have passed since start-up on this rank.
  bool out_of_time() const;
  // SIGINT and SIGTERM ask for a stop, which the next step's agreement carries to every rank.
  static void watch_stop_signals();
  // false: skipped. `scale`: the loss scale the step's backward ran at. `own`: the step
  // trains a target of the kind's own (none: the Trainable, with the EMA and ZeRO's gather).
  bool update(const StepVerdict& verdict, double grad_norm, double lr, double scale,
              const std::optional<OwnTarget>& own);
  // The run's position and metadata, as the checkpoint's trainer_state.json holds them.
  ckpt::TrainerState run_state() const;
  void finish();

  const config::Config& cfg_;
  dist::Runtime& rt_;
  const TestHooks& hooks_;
  const bool main_rank_;
  // The run's parts, in start()'s order.
  std::optional<data::Dataset> dataset_;
  std::shared_ptr<data::SampleCache> cache_;  // data.cache (null: none)
  model::ModelSpec spec_;
  model::SanaMS model_{nullptr};
  Encoders encoders_;
  data::ControlMapOptions control_maps_;  // a ControlNet's (kind none otherwise)
  std::unique_ptr<Trainable> trainable_;  // what the run trains: the model, or adapters on it (train.lora)
  std::unique_ptr<parallel::Reducer> reducer_;
  std::optional<parallel::Zero> zero_;  // what this rank keeps (train.zero_stage)
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<Ema> ema_;
  std::optional<BadSampleGuard> guard_;
  std::optional<NonfinitePolicy> nonfinite_;
  std::optional<LossScaler> scaler_;
  std::optional<TrainStep> step_;
  // The kind of training (step/training_step.h): flow matching, SANA-Sprint's stage 2, ...
  std::unique_ptr<TrainingStep> kind_;
  std::optional<Previews> previews_;
  std::optional<EvalLoss> eval_;  // train.eval (none when off)
  std::optional<data::Dataset> classes_;  // data.class_data_dir's class images (none when off)
  // The trained weights', the EMA's and the optimizer's checkpoint parts, as ZeRO keeps them.
  std::optional<parallel::ShardedState> sharded_;
  std::optional<Checkpointer> checkpointer_;
  std::optional<Metrics> metrics_;
  std::optional<StepProfiler> profiler_;  // train.profile_steps
  std::unique_ptr<DeviceTimeline> timeline_;  // on CUDA: the phases timed on the device
  // Where the run stands: the position and the epoch in progress's batch segments.
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  RunState run_;
  // dist.elastic continue within this trainer: where its state comes from, the share
  // mirror, a loss met after a step's commit, a replacement coming in, a regroup.
  Continuation elastic_;
  int64_t total_steps_ = 0;
  std::optional<LrScheduler> lr_scheduler_;  // train.optimizer.lr and the schedule keys; where it stands
  bool stopped_ = false;
  bool memory_reported_ = false;
};

// train.micro_batch_size auto (config/config.h): `cfg` with the micro-batch and gradient
// checkpointing `sana-train model --device-memory` suggests for the smallest memory budget
// among the group's ranks (train/report/micro_batch.h), auto replaced by them. A collective:
// every rank gives its budget, rank 0 measures the activations and decides, every rank
// takes its decision (trainer_micro_batch.cpp). Without auto, `cfg` as it is.
config::Config with_micro_batch_chosen(const config::Config& cfg, dist::Runtime& rt);

}  // namespace sana::train
