// The trainer's start-up (Trainer::start): every part built in the order every rank must
// build it, each collective marked; and what a regroup in place builds again.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>

#include "sana/data/plan_coverage.h"
#include "sana/model/spec.h"
#include "sana/model/weights.h"
#include "sana/train/checkpoint/resume.h"
#include "sana/train/input/batching.h"
#include "sana/train/input/shared_dataset.h"
#include "sana/train/loop/cuda_modes.h"
#include "sana/train/loop/trainer.h"
#include "sana/train/optim/host_optimizer.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/trainable/initial_model.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

// The step's phases timed on the device (step/device_timeline.h): CUDA events on a GPU; on the
// CPU none, but for the tests (TestHooks::host_timeline), on the host's clock.
std::unique_ptr<DeviceTimeline> device_timeline_for(const torch::Device& device, const TestHooks& hooks) {
  if (device.is_cuda()) return std::make_unique<DeviceTimeline>(DeviceTimeline::cuda_events());
  if (hooks.host_timeline) return std::make_unique<DeviceTimeline>(DeviceTimeline::host_clock());
  return nullptr;
}

// The optimizer over this rank's share (`zero`'s): in host memory with fp32 masters under
// train.offload_optimizer, else over the flat buckets on the device; ZeRO's part of each
// update (its post-step, whatever the stage) follows every step.
std::unique_ptr<Optimizer> optimizer_for(const config::Config& cfg, parallel::Zero& zero,
                                         const parallel::Reducer& reducer) {
  const auto options = optimizer_options_for(cfg);
  std::unique_ptr<Optimizer> optimizer;
  if (cfg.train.offload_optimizer) {
    optimizer = std::make_unique<HostOptimizer>(options, zero.owned(), zero.optimizer_buckets(),
                                                reducer.gradients_on_host());
  } else {
    optimizer = make_optimizer(options, zero.owned());
    optimizer->use_flat_buckets(zero.optimizer_buckets());
  }
  optimizer->after_step(zero.after_update());
  // Sums over the whole model (Prodigy's) in one order at every world size and stage.
  optimizer->sum_parameters_with([&zero](const torch::Tensor& mine) { return zero.sum_over_parameters(mine); });
  optimizer->keep_in_checkpoints(cfg.ckpt.save_optimizer);
  return optimizer;
}

}  // namespace

Trainer::Trainer(const config::Config& cfg, dist::Runtime& rt, const TestHooks& hooks, Continuation& elastic)
    : cfg_(cfg),
      rt_(rt),
      hooks_(hooks),
      run_(batch_spec_for(cfg)),
      elastic_(elastic),
      stops_(cfg.train.early_stop_hours) {
  start();
}

// Every rank runs these lines in this order; "collective" marks each that talks to the
// other ranks (a reordering there would pair different collectives across ranks).
void Trainer::start() {
  open_training_set();  // collective: rank 0 indexes, one cache per node
  build_model();  // collective: rank 0's weights, the class images generated, the adapters agreed
  build_update();
  step_.emplace(step_options_for(cfg_, hooks_, rt_.rank(), rt_.world_size(), update_.zero->forwards_collective()),
                model_.net, model_.encoders, *update_.reducer);
  kind_ = training_step_for(cfg_, {model_.net, *update_.reducer, rt_});  // collective for some kinds (a teacher agreed)
  evaluation_.previews.emplace(preview_policy_for(cfg_), preview_sources_for(cfg_), rt_, model_.net, model_.encoders,
                               *input_.dataset);
  open_eval_set();  // collective under train.eval: rank 0 indexes the held-out samples
  checkpointer_.emplace(checkpoint_options_for(cfg_, hooks_.checkpoint_stage_delay()), main_rank());
  register_checkpointed_parts();  // collective: who writes and reads each entry

  const auto first = epoch_plan(0, true);
  data::check_plan_coverage(*input_.dataset, first, "training");
  check_world_fits(first, rt_.world_size(), batch_spec_for(cfg_));
  if (cfg_.train.deterministic) check_deterministic(first, batch_options_for(cfg_), rt_);
  if (elastic_.from_peers()) {
    resume_from_peers();  // collective: rank 0's state
  } else {
    resume();  // collective: rank 0 picks the checkpoint
  }
  if (!run_.resumed()) carry_over_load_from();  // collective under train.load_from_optimizer
  update_.optimizer->weights_changed();  // train.offload_optimizer: the masters take the resumed weights
  if (rt_.elastic() && update_.zero->shards_state()) {  // collective: each share to the rank that mirrors it
    if (cfg_.train.optimizer.type == config::OptimizerType::Prodigy) {
      throw UsageError(
          "train.optimizer.type: Prodigy with dist.elastic continue under train.zero_stage >= 1: its step size is a "
          "sum over every rank's share, which a share's mirror cannot take: use train.zero_stage 0 with "
          "dist.elastic continue, or another optimizer");
    }
    const double ema_rate = config::ema_enabled(cfg_.train) ? cfg_.train.ema_rate : 0.0;
    auto mirror = std::make_unique<ShareMirror>(rt_, *update_.zero, *update_.reducer,
                                                optimizer_options_for(cfg_), ema_rate,
                                                ema_placement_for(cfg_.train));
    elastic_.mirror_shares(std::move(mirror), *update_.optimizer, *update_.ema);
  }
  use_empty_prompt();  // collective: rank 0's null caption
  run_.plan_total_steps(count_total_steps());
  start_reporting();
  elastic_.attach({update_, *checkpointer_, *input_.guard, *report_.metrics, run_, [this] { return run_state(); },
                   [this] { follow_group(); }});
  log_start();
  StopRequests::watch_signals();
}

void Trainer::open_training_set() {
  auto training_set = shared_dataset_options_for(cfg_);
  training_set.index_delay_ms = hooks_.index_delay_ms;
  input_.dataset.emplace(open_dataset(training_set, rt_));  // collective: rank 0 indexes, all agree
  input_.cache = open_sample_cache(sample_cache_options_for(cfg_), *input_.dataset, rt_);  // collective
  input_.guard.emplace(cfg_.data.max_bad_fraction, BadSampleGuard::kMinReads, /*carries=*/main_rank());
}

void Trainer::build_model() {
  model_.spec = model_spec_for(cfg_);
  const bool control = model_.spec.control_blocks > 0;
  if (control) control_map_options_for(cfg_);  // what the loader cannot make: exit 2 now
  const auto initial = initial_model_options_for(cfg_);
  model_.net = build_initial_model(initial, model_.spec, rt_);  // collective
  model_.encoders =
      load_encoders(encoder_options_for(cfg_), rt_.device(), EncoderUse::training, model_.spec.conditioning);
  if (control) input_.control_maps = control_maps_for(control_map_options_for(cfg_), model_.encoders);
  if (config::prior_preservation(cfg_.data)) open_class_images();  // collective: missing ones generated
  model_.trainable = make_trainable(lora_for(cfg_), model_.net, rt_);  // collective under train.lora
  model_.swapped = swap_blocks(initial, *model_.net, rt_.device());  // before the reducer: it sees host parameters
}

void Trainer::build_update() {
  update_.reducer = parallel::make_reducer(rt_, model_.trainable->parameters(), reducer_options_for(cfg_));
  const auto compute = compute_type(rt_.device(), half_type(cfg_.model.mixed_precision));
  update_.zero.emplace(zero_options_for(cfg_), rt_, model_.trainable->parameters(), *update_.reducer, *model_.net,
                       compute);
  // CUDA autocast: the trained weights cast to half once a step (ZeRO 3 gathers half copies).
  // Never for swapped trained blocks: their copies would stay on the device.
  const bool keep = compute != at::kFloat && config::working_weights_on(cfg_.train) &&
                    !update_.zero->forwards_collective() && !(model_.swapped && model_.swapped->trained());
  model::use_working_weights(*model_.net, keep);
  update_.optimizer = optimizer_for(cfg_, *update_.zero, *update_.reducer);
  auto ema_placement = ema_placement_for(cfg_.train);
  ema_placement.device = rt_.device();
  update_.ema.emplace(update_.zero->owned(), config::ema_enabled(cfg_.train) ? cfg_.train.ema_rate : 0.0,
                      cfg_.ckpt.save_ema, model_.trainable->file_metadata(), ema_placement);
  update_.nonfinite.emplace(cfg_.train.max_nonfinite);
  update_.scaler.emplace(loss_scaling(rt_.device(), half_type(cfg_.model.mixed_precision)));
  // The steps that move the schedule are the kind's to say (not those skipped for fp16 overflow).
  update_.lr_scheduler.emplace(lr_schedule_options_for(cfg_.train), [this] {
    return kind_->schedule_position(run_.position().global_step, update_.scaler->overflows());
  });
}

void Trainer::start_reporting() {
  report_.metrics.emplace(metrics_options_for(cfg_), main_rank(), run_.total_steps(),
                          run_.resumed() && run_.position().global_step > 0, rt_.world_size(), device_peak_flops());
  report_.profiler.emplace(cfg_.train.profile_steps, cfg_.work_dir, main_rank(), rt_.device().is_cuda());
  if (rt_.device().is_cuda()) apply_cuda_modes({cfg_.train.cudnn_benchmark, cfg_.train.cuda_sync_debug});
  report_.timeline = device_timeline_for(rt_.device(), hooks_);
}

// train.eval: the held-out samples, indexed and bucketed as the training set is.
void Trainer::open_eval_set() {
  const auto& e = cfg_.train.eval;
  if (e.every_steps <= 0) return;
  auto o = shared_dataset_options_for(cfg_);
  o.work = "eval index";
  if (e.fraction > 0) {
    o.dataset.filter.held_out = true;  // the share of data.data_dir that training leaves out
  } else {
    o.dataset.sources = e.data_dir;
    o.dataset.filter = {};  // every held-out sample counts
  }
  auto held_out = open_dataset(o, rt_);  // collective
  EvalOptions options{e.every_steps, e.timesteps, e.max_samples};
  auto loader = loader_options();
  evaluation_.held_out.emplace(std::move(options), std::move(held_out), std::move(loader), rt_);
  log::info("train.eval: {} held-out samples at timesteps {}, every {} steps", evaluation_.held_out->samples(),
            fmt::join(e.timesteps, ", "), e.every_steps);
}

// After the group re-formed in place (Continuation::regroup): the step's share of each
// batch, and the held-out loader's (a collective).
void Trainer::follow_group() {
  step_.emplace(step_options_for(cfg_, hooks_, rt_.rank(), rt_.world_size(), update_.zero->forwards_collective()),
                model_.net, model_.encoders, *update_.reducer);
  if (evaluation_.held_out) {
    evaluation_.held_out.reset();
    open_eval_set();  // collective
  }
}

// data.class_data_dir: the class images, the missing ones generated by the model as loaded
// (before adapters, resume or any step), under its null caption for the guidance.
void Trainer::open_class_images() {
  use_empty_prompt();  // collective
  const auto o = class_image_options_for(cfg_);
  input_.classes.emplace(train::open_class_images(o, model_.net, model_.encoders, rt_));  // collective
  const auto n = std::min<uint64_t>(input_.classes->index().size(), static_cast<uint64_t>(o.count));
  if (n == 0) {
    throw UsageError(fmt::format("data.class_data_dir '{}' holds no readable image; fill it or let the run generate "
                                 "them (data.num_class_images)",
                                 o.dir));
  }
  log::info("data.class_data_dir: each sample trains beside one of {} class images (\"{}\"); loss = the sample's + "
            "{:g} x the class image's (train.prior_loss_weight)",
            n, o.prompt, cfg_.train.prior_loss_weight);
}

// As upstream, from scratch and on loading weights: the null caption (y_embedding, used for
// caption dropout and guidance) becomes the text encoder's features of the empty prompt.
void Trainer::use_empty_prompt() {
  if (!train::use_empty_prompt(model_.net, model_.encoders, config::null_embed_file(cfg_))) return;
  torch::NoGradGuard no_grad;
  auto null_caption = model_.net->caption_embedder->y_embedding.contiguous();
  rt_.broadcast(null_caption);  // every rank takes rank 0's
  model_.net->caption_embedder->y_embedding.copy_(null_caption);
}

}  // namespace sana::train
