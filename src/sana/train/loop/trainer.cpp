#include "sana/train/loop/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "sana/util/safetensors.h"
#include "sana/config/loader.h"
#include "sana/data/distributed_sampler.h"
#include "sana/data/plan_coverage.h"
#include "sana/data/png_decode.h"
#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/model/spec.h"
#include "sana/model/weights.h"
#include "sana/train/input/batching.h"
#include "sana/train/options/core_options.h"
#include "sana/train/loop/cuda_modes.h"
#include "sana/train/optim/host_optimizer.h"
#include "sana/train/trainable/initial_model.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/elastic/peer_state.h"
#include "sana/train/report/device_peak.h"
#include "sana/train/report/report.h"
#include "sana/train/checkpoint/resume.h"
#include "sana/train/input/shared_dataset.h"
#include "sana/train/test_hooks.h"
#include "sana/util/error.h"
#include "sana/util/hash.h"
#include "sana/util/log.h"

namespace fs = std::filesystem;

namespace sana::train {

namespace {

data::LoaderOptions loader_options(const config::Config& cfg, int rank, int world, bool pin_memory,
                                   const data::ControlMapOptions& control) {
  auto o = loader_options_for(cfg);
  o.control = control;
  o.rank = rank;
  o.world_size = world;
  o.pin_memory = pin_memory;
  o.micro_batch = cfg.train.micro_batch_size;
  o.random_flip = cfg.data.random_flip;
  o.whole_micro_batches = cfg.train.deterministic;
  return o;
}

// Tests only (TestHooks::fail_at): a data error on one rank mid-epoch.
void inject_test_failure(const TestHooks& hooks, int rank, int64_t global_step) {
  if (TestHooks::matches(hooks.fail_at, rank, global_step)) {
    throw data::LoaderError(TestHooks::injected_failure(global_step));
  }
}

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
  const auto options = optimizer_options_for(cfg.train.optimizer);
  std::unique_ptr<Optimizer> optimizer;
  if (cfg.train.offload_optimizer) {
    optimizer = std::make_unique<HostOptimizer>(options, zero.owned(), zero.optimizer_buckets(),
                                                reducer.gradients_on_host());
  } else {
    optimizer = make_optimizer(options, zero.owned());
    optimizer->use_flat_buckets(zero.optimizer_buckets());
  }
  optimizer->after_step(zero.after_update());
  optimizer->keep_in_checkpoints(cfg.ckpt.save_optimizer);
  return optimizer;
}

}  // namespace

Trainer::Trainer(const config::Config& cfg, dist::Runtime& rt, const TestHooks& hooks, bool from_peers,
                 const ckpt::Snapshot* carried)
    : cfg_(cfg),
      rt_(rt),
      hooks_(hooks),
      main_rank_(rt.rank() == 0),
      run_(batch_spec_for(cfg)),
      elastic_(rt, from_peers, carried) {
  start();
}

// Every rank runs these lines in this order; "collective" marks each that talks to the
// other ranks (a reordering there would pair different collectives across ranks).
void Trainer::start() {
  const int rank = rt_.rank(), world = rt_.world_size();
  auto training_set = shared_dataset_options_for(cfg_);
  training_set.index_delay_ms = hooks_.index_delay_ms;
  dataset_.emplace(open_dataset(training_set, rt_));  // collective: rank 0 indexes, all agree
  cache_ = open_sample_cache(sample_cache_options_for(cfg_), *dataset_, rt_);  // collective: one cache per node
  spec_ = model_spec_for(cfg_);
  if (spec_.control_blocks > 0) control_map_options_for(cfg_);  // what the loader cannot make: exit 2 now
  model_ = build_initial_model(initial_model_options_for(cfg_), spec_, rt_);  // collective: rank 0's weights agreed
  encoders_ = load_encoders(encoder_options_for(cfg_), rt_.device(), EncoderUse::training, spec_.conditioning);
  if (spec_.control_blocks > 0) control_maps_ = control_maps_for(control_map_options_for(cfg_), encoders_);
  if (config::prior_preservation(cfg_.data)) open_class_images();  // collective: missing ones generated
  trainable_ = make_trainable(lora_for(cfg_), model_, rt_);  // collective under train.lora: the adapters agreed
  reducer_ = parallel::make_reducer(rt_, trainable_->parameters(), reducer_options_for(cfg_));
  zero_.emplace(zero_options_for(cfg_), rt_, trainable_->parameters(), *reducer_, *model_,
                compute_type(rt_.device(), half_type(cfg_.model.mixed_precision)));
  // CUDA autocast: the trained weights cast to half once a step (ZeRO 3 gathers half copies).
  const bool half = compute_type(rt_.device(), half_type(cfg_.model.mixed_precision)) != at::kFloat;
  const bool keep = half && config::working_weights_on(cfg_.train) && !zero_->forwards_collective();
  model::use_working_weights(*model_, keep);
  optimizer_ = optimizer_for(cfg_, *zero_, *reducer_);
  ema_.emplace(zero_->owned(), config::ema_enabled(cfg_.train) ? cfg_.train.ema_rate : 0.0, cfg_.ckpt.save_ema,
               trainable_->file_metadata(), ema_placement_for(cfg_.train));
  guard_.emplace(cfg_.data.max_bad_fraction, BadSampleGuard::kMinReads, /*carries=*/main_rank_);
  nonfinite_.emplace(cfg_.train.max_nonfinite);
  scaler_.emplace(loss_scaling(rt_.device(), half_type(cfg_.model.mixed_precision)));
  // The steps that move the schedule are the kind's to say (not those skipped for fp16 overflow).
  lr_scheduler_.emplace(lr_schedule_options_for(cfg_.train), [this] {
    return kind_->schedule_position(run_.position().global_step, scaler_->overflows());
  });
  step_.emplace(step_options_for(cfg_, hooks_, rank, world, zero_->forwards_collective()), model_, encoders_,
                *reducer_);
  kind_ = training_step_for(cfg_, {model_, *reducer_, rt_});  // collective for some kinds (a teacher agreed)
  previews_.emplace(preview_policy_for(cfg_), preview_sources_for(cfg_), rt_, model_, encoders_, *dataset_);
  open_eval_set();  // collective under train.eval: rank 0 indexes the held-out samples
  checkpointer_.emplace(checkpoint_options_for(cfg_, hooks_.checkpoint_stage_delay()), main_rank_);
  register_checkpointed_parts();

  const auto first = epoch_plan(0, true);
  data::check_plan_coverage(*dataset_, first, "training");
  check_world_fits(first, world, batch_spec_for(cfg_));
  if (cfg_.train.deterministic) check_deterministic(first, batch_options_for(cfg_), rt_);
  if (elastic_.from_peers()) {
    resume_from_peers();  // collective: rank 0's state
  } else {
    resume();  // collective: rank 0 picks the checkpoint
  }
  if (!run_.resumed()) carry_over_load_from();                      // collective under train.load_from_optimizer
  optimizer_->weights_changed();  // train.offload_optimizer: the masters take the resumed weights
  if (rt_.elastic() && zero_->shards_state()) {  // collective: each share to the rank that mirrors it
    const double ema_rate = config::ema_enabled(cfg_.train) ? cfg_.train.ema_rate : 0.0;
    auto mirror = std::make_unique<ShareMirror>(rt_, *zero_, *reducer_, optimizer_options_for(cfg_.train.optimizer),
                                                ema_rate, ema_placement_for(cfg_.train));
    elastic_.mirror_shares(std::move(mirror), *optimizer_, *ema_);
  }
  use_empty_prompt();  // collective: rank 0's null caption
  total_steps_ = count_total_steps();
  metrics_.emplace(metrics_options_for(cfg_), main_rank_, total_steps_, run_.resumed() && run_.position().global_step > 0, world,
                   device_peak_flops());
  profiler_.emplace(cfg_.train.profile_steps, cfg_.work_dir, main_rank_, rt_.device().is_cuda());
  if (rt_.device().is_cuda()) apply_cuda_modes({cfg_.train.cudnn_benchmark, cfg_.train.cuda_sync_debug});
  timeline_ = device_timeline_for(rt_.device(), hooks_);
  log_start();
  watch_stop_signals();
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
  auto loader = loader_options(cfg_, rt_.rank(), rt_.world_size(), step_->pinned(), control_maps_);
  eval_.emplace(std::move(options), std::move(held_out), std::move(loader), rt_);
  log::info("train.eval: {} held-out samples at timesteps {}, every {} steps", eval_->samples(),
            fmt::join(e.timesteps, ", "), e.every_steps);
}

// data.class_data_dir: the class images, the missing ones generated by the model as loaded
// (before adapters, resume or any step), under its null caption for the guidance.
void Trainer::open_class_images() {
  use_empty_prompt();  // collective
  const auto o = class_image_options_for(cfg_);
  classes_.emplace(train::open_class_images(o, model_, encoders_, rt_));  // collective
  const auto n = std::min<uint64_t>(classes_->index().size(), static_cast<uint64_t>(o.count));
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
  if (!train::use_empty_prompt(model_, encoders_, config::null_embed_file(cfg_))) return;
  torch::NoGradGuard no_grad;
  auto null_caption = model_->caption_embedder->y_embedding.contiguous();
  rt_.broadcast(null_caption);  // every rank takes rank 0's
  model_->caption_embedder->y_embedding.copy_(null_caption);
}

data::EpochPlan Trainer::epoch_plan(int64_t epoch, bool fresh) const {
  if (cfg_.data.sampler == config::DataSampler::distributed) {
    return data::make_epoch_plan(*dataset_, epoch, rt_.world_size(), cfg_.train.micro_batch_size);
  }
  return !fresh && epoch == run_.position().epoch ? dataset_->plan(epoch, run_.segments()) : dataset_->plan(epoch);
}

int64_t Trainer::count_total_steps() const {
  const auto& t = cfg_.train;
  int64_t total = run_.position().global_step;
  if (run_.position().epoch < t.num_epochs) {
    total += epoch_plan(run_.position().epoch).steps() - run_.position().step_in_epoch +
             epoch_plan(0, true).steps() * (t.num_epochs - run_.position().epoch - 1);
  }
  return t.max_steps > 0 ? std::min(total, t.max_steps) : total;
}

bool Trainer::run() {
  for (;;) {
    try {
      for (int64_t epoch = run_.position().epoch; epoch < cfg_.train.num_epochs && !stopped_; ++epoch) {
        if (run_.position().global_step >= total_steps_) break;
        stopped_ = !run_epoch(epoch);
        if (elastic_.taking_in()) return false;
      }
      break;
    } catch (const dist::RankLost& e) {
      if (!rt_.elastic()) throw;
      // dist.elastic continue: on from the last committed step, here or in a trainer built
      // for the new group (train())
      if (!regroup(e.what())) return false;
    }
  }
  finish();
  return true;
}

bool Trainer::run_epoch(int64_t epoch) {
  const auto plan = epoch_plan(epoch);
  agree_on_epoch_plan(rt_, plan);
  const int64_t first_step = epoch == run_.position().epoch ? run_.position().step_in_epoch : 0;
  auto options = loader_options(cfg_, rt_.rank(), rt_.world_size(), step_->pinned(), control_maps_);
  options.cache = cache_;
  if (classes_) {
    options.prior = &*classes_;
    options.prior_count = static_cast<uint64_t>(cfg_.data.num_class_images);
  }
  // Counted before the loader exists: its workers start reading as it is made.
  const int64_t hits = cache_ ? cache_->hits() : 0, misses = cache_ ? cache_->misses() : 0;
  data::Loader loader(*dataset_, plan, options, first_step);
  metrics_->new_loader(loader.wait_seconds());
  for (int64_t step = first_step; step < plan.steps() && run_.position().global_step < total_steps_; ++step) {
    if (!train_step(loader, epoch, step, plan.steps())) return false;
  }
  if (cache_) log_cache_use(*cache_, epoch, hits, misses);
  return true;
}

bool Trainer::train_step(data::Loader& loader, int64_t epoch, int64_t step, int64_t steps_in_epoch) {
  if (cfg_.ddp.broadcast_buffers) {
    torch::NoGradGuard no_grad;
    for (auto& b : model_->buffers()) rt_.broadcast(b);
  }
  const auto own = kind_->own_target(run_.position().global_step);
  // A target of the kind's own (SANA-Sprint's heads, as upstream's optimizer_D):
  // train.optimizer.lr (auto_lr applied), no schedule.
  const double lr = own ? peak_learning_rate(lr_scheduler_->options()) : lr_scheduler_->rate(total_steps_);
  const double scale = scaler_->scale();
  // The step's phase timers mark the device timeline too; its end is marked last.
  std::optional<DeviceTimeline::Active> marking;
  if (timeline_) marking.emplace(*timeline_);
  PeakProbe peak(rt_.device());
  if (!memory_reported_) peak.begin();
  PhaseLosses phase_losses;
  profiler_->begin(run_.position().global_step + 1);
  auto out = kind_->run(*step_, loader, {epoch, step, run_.position().global_step, scale}, *guard_, phase_losses);
  if (!memory_reported_) peak.end();
  const auto [verdict, grad_norm, applied] = agree_and_update(out, lr, scale, own);
  // The step is applied on every rank: the position moves before the next collective.
  const bool epoch_end = step + 1 == steps_in_epoch;
  run_.advance(epoch, step, epoch_end, out.samples);
  elastic_.raise_lost();  // a loss met after the commit: the step is kept, the regroup follows it
  if (!memory_reported_) report_memory(peak, out);
  const int64_t global_step = run_.position().global_step;
  profiler_->end();
  {
    PhaseTimer timer(out.times, &StepTimes::checkpoint_preview);
    preview_and_evaluate(global_step, epoch_end, epoch);
  }
  const StepRecord record = step_record(epoch, step, {verdict, grad_norm, applied}, lr, out, !own,
                                        std::move(phase_losses));
  if (timeline_) {  // the steps the device has finished by now (the agreement's read waited for the last)
    for (const auto& f : timeline_->take_finished()) metrics_->record_device(f.step, f.times);
  }
  metrics_->record(record, out.times, loader.wait_seconds(), verdict.stop_requested());
  inject_test_failure(hooks_, rt_.rank(), global_step);
  StepTimes saving;
  {
    PhaseTimer timer(saving, &StepTimes::checkpoint_preview);
    checkpointer_->maybe_save(run_.position(), total_steps_, epoch_end, epoch, verdict.stop_requested(),
                              [this] { return run_state(); });
  }
  metrics_->add_time(saving);
  if (timeline_) timeline_->end_step(global_step);
  if (elastic_.take_in_replacements(verdict.stop_requested())) return false;  // a new trainer takes them in
  if (!verdict.stop_requested()) return true;
  if (verdict.out_of_time) {
    log::info("train.early_stop_hours: {} h have passed since start-up (rank {}): every rank stops after step {}, "
              "with a checkpoint; resume_from: latest continues", cfg_.train.early_stop_hours,
              fmt::join(verdict.stop_ranks, ", "), global_step);
  } else {
    log::info("stop requested (SIGINT/SIGTERM) on rank {}: every rank stops after step {}",
              fmt::join(verdict.stop_ranks, ", "), global_step);
  }
  return false;
}

StepRecord Trainer::step_record(int64_t epoch, int64_t step, const Outcome& o, double lr, const StepOutput& out,
                                bool has_loss, PhaseLosses figures) const {
  const auto& [verdict, grad_norm, applied] = o;
  StepRecord record;
  const int64_t global_step = run_.position().global_step;
  record.epoch = epoch;
  record.epoch_step = step;
  record.global_step = global_step;
  record.loss = verdict.loss_mean;
  record.grad_norm = grad_norm;
  record.lr = lr;
  record.height = out.height;
  record.width = out.width;
  record.skipped = !applied;
  record.samples = out.samples;
  record.bad_samples = guard_->totals().first;
  const auto forward = model::forward_flops(spec_, out.height, out.width);
  // data.class_data_dir: each sample's class image runs through the model too. Some kinds'
  // steps are not counted (SANA-Sprint's: no FLOP/s, no MFU).
  if (kind_->counts_flops()) {
    record.train_flops = train_flops(config::lora_enabled(cfg_.train), spec_, forward) *
                         static_cast<double>(out.samples) * (classes_ ? 2.0 : 1.0);
  }
  record.has_loss = has_loss;
  record.figures = std::move(figures);
  return record;
}

void Trainer::preview_and_evaluate(int64_t global_step, bool epoch_end, int64_t epoch) {
  std::optional<parallel::Zero::Whole> whole;  // stage 3: previews and the held-out loss run the whole model
  const bool evaluate = eval_ && eval_->due(global_step);
  if (evaluate || !previews_->due(global_step, total_steps_, epoch_end, epoch).empty()) whole.emplace(*zero_);
  previews_->maybe_render(global_step, total_steps_, epoch_end, epoch);
  previews_->publish(metrics_->events());
  if (!evaluate) return;
  const auto r = eval_->run(*step_, global_step);  // collective
  log::info("{}", r.line());
  metrics_->record_eval(r.global_step, r.samples, r.loss, r.by_timestep);
}

void Trainer::finish() {
  const int64_t global_step = run_.position().global_step;
  parallel::Zero::Whole whole(*zero_);  // stage 3: previews, the check and the weights see the whole model
  if (cfg_.train.visualize) previews_->render(global_step, "end of training");
  const auto sums = rt_.all_gather("final weights checksum", trainable_->checksum());
  if (std::adjacent_find(sums.begin(), sums.end(), std::not_equal_to<>()) != sums.end()) {
    throw dist::Disagreement(fmt::format("parameters differ between ranks after step {}: checksums {}", global_step,
                                         fmt::join(sums, ", ")));
  }
  const int world = rt_.world_size();
  log::info("parameters identical on all {} rank{} (checksum {})", world, world == 1 ? "" : "s", sums.front());
  kind_->check_agreement(rt_, global_step);  // collective
  trainable_->check_base();
  previews_->publish(metrics_->events());  // every rank's last grids are written: they are past the gather
  if (main_rank_) trainable_->write_final(cfg_.work_dir, {{"model", spec_.name}, {"step", std::to_string(global_step)}});
  if (config::ema_enabled(cfg_.train)) {
    const auto ema = zero_->collect("EMA weights", ema_->named_averages(), main_rank_);  // collective
    if (main_rank_) {
      auto metadata = trainable_->file_metadata();
      metadata.insert({{"model", spec_.name}, {"ema_rate", fmt::format("{}", ema_->rate())}});
      write_safetensors((fs::path(cfg_.work_dir) / "ema.safetensors").string(), ema, metadata);
    }
  }
  metrics_->finish(global_step, nonfinite_->skipped() + scaler_->overflows(), stopped_);
  const std::string codec = data::codec_warning_summary();
  if (!codec.empty()) log::info("image decoder warnings on this rank (the images decoded): {}", codec);
  if (main_rank_) {
    const auto rep = write_report(cfg_.work_dir);
    if (!rep.error.empty()) log::warn("report: {}", rep.error);
    for (const auto& p : rep.plots) log::info("plot: {}", p);
  }
  checkpointer_->finish();
}

}  // namespace sana::train
