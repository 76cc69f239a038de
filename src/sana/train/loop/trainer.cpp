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

// Tests only (TestHooks::fail_at): a data error on one rank mid-epoch.
void inject_test_failure(const TestHooks& hooks, int rank, int64_t global_step) {
  if (TestHooks::matches(hooks.fail_at, rank, global_step)) {
    throw data::LoaderError(TestHooks::injected_failure(global_step));
  }
}

}  // namespace

data::LoaderOptions Trainer::loader_options() const {
  auto o = loader_options_for(cfg_);
  o.control = input_.control_maps;
  o.rank = rt_.rank();
  o.world_size = rt_.world_size();
  o.pin_memory = step_->pinned();
  o.micro_batch = cfg_.train.micro_batch_size;
  o.random_flip = cfg_.data.random_flip;
  o.whole_micro_batches = cfg_.train.deterministic;
  return o;
}

data::EpochPlan Trainer::epoch_plan(int64_t epoch, bool fresh) const {
  if (cfg_.data.sampler == config::DataSampler::distributed) {
    return data::make_epoch_plan(*input_.dataset, epoch, rt_.world_size(), cfg_.train.micro_batch_size);
  }
  const bool in_progress = !fresh && epoch == run_.position().epoch;
  return in_progress ? input_.dataset->plan(epoch, run_.segments()) : input_.dataset->plan(epoch);
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
      for (int64_t epoch = run_.position().epoch; epoch < cfg_.train.num_epochs && !stops_.was_stopped(); ++epoch) {
        if (run_.position().global_step >= run_.total_steps()) break;
        if (!run_epoch(epoch)) stops_.stopped();
        if (elastic_.taking_in()) return false;
      }
      break;
    } catch (const dist::RankLost& e) {
      if (!rt_.elastic()) throw;
      // dist.elastic continue: on from the last committed step, here or in a trainer built
      // for the new group (train())
      if (!elastic_.regroup(e.what())) return false;
    }
  }
  finish();
  return true;
}

bool Trainer::run_epoch(int64_t epoch) {
  const auto plan = epoch_plan(epoch);
  agree_on_epoch_plan(rt_, plan);
  const int64_t first_step = epoch == run_.position().epoch ? run_.position().step_in_epoch : 0;
  auto options = loader_options();
  options.cache = input_.cache;
  if (input_.classes) {
    options.prior = &*input_.classes;
    options.prior_count = static_cast<uint64_t>(cfg_.data.num_class_images);
  }
  // Counted before the loader exists: its workers start reading as it is made.
  const int64_t hits = input_.cache ? input_.cache->hits() : 0, misses = input_.cache ? input_.cache->misses() : 0;
  data::Loader loader(*input_.dataset, plan, options, first_step);
  report_.metrics->new_loader(loader.wait_seconds());
  for (int64_t step = first_step; step < plan.steps() && run_.position().global_step < run_.total_steps(); ++step) {
    if (!train_step(loader, epoch, step, plan.steps())) return false;
  }
  if (input_.cache) log_cache_use(*input_.cache, epoch, hits, misses);
  return true;
}

bool Trainer::train_step(data::Loader& loader, int64_t epoch, int64_t step, int64_t steps_in_epoch) {
  if (cfg_.ddp.broadcast_buffers) {
    torch::NoGradGuard no_grad;
    for (auto& b : model_.net->buffers()) rt_.broadcast(b);
  }
  const auto own = kind_->own_target(run_.position().global_step);
  // A target of the kind's own (SANA-Sprint's heads, as upstream's optimizer_D):
  // train.optimizer.lr (auto_lr applied), no schedule.
  const auto& schedule = *update_.lr_scheduler;
  const double lr = own ? peak_learning_rate(schedule.options()) : schedule.rate(run_.total_steps());
  const double scale = update_.scaler->scale();
  // The step's phase timers mark the device timeline too; its end is marked last.
  std::optional<DeviceTimeline::Active> marking;
  if (report_.timeline) marking.emplace(*report_.timeline);
  PeakProbe peak(rt_.device());
  if (!report_.memory_reported) peak.begin();
  PhaseLosses phase_losses;
  report_.profiler->begin(run_.position().global_step + 1);
  auto out = kind_->run(*step_, loader, {epoch, step, run_.position().global_step, scale}, *input_.guard, phase_losses);
  if (!report_.memory_reported) peak.end();
  const auto [verdict, grad_norm, applied] = agree_and_update(out, lr, scale, own);
  // The step is applied on every rank: the position moves before the next collective.
  const bool epoch_end = step + 1 == steps_in_epoch;
  run_.advance(epoch, step, epoch_end, out.samples);
  elastic_.raise_lost();  // a loss met after the commit: the step is kept, the regroup follows it
  if (!report_.memory_reported) report_memory(peak, out);
  const int64_t global_step = run_.position().global_step;
  report_.profiler->end();
  {
    PhaseTimer timer(out.times, &StepTimes::checkpoint_preview);
    preview_and_evaluate(global_step, epoch_end, epoch);
  }
  const StepRecord record = step_record(epoch, step, {verdict, grad_norm, applied}, lr, out, !own,
                                        std::move(phase_losses));
  if (report_.timeline) {  // the steps the device has finished by now (the agreement's read waited for the last)
    for (const auto& f : report_.timeline->take_finished()) report_.metrics->record_device(f.step, f.times);
  }
  report_.metrics->record(record, out.times, loader.wait_seconds(), verdict.stop_requested());
  inject_test_failure(hooks_, rt_.rank(), global_step);
  StepTimes saving;
  {
    PhaseTimer timer(saving, &StepTimes::checkpoint_preview);
    checkpointer_->maybe_save(run_.position(), run_.total_steps(), epoch_end, epoch, verdict.stop_requested(),
                              [this] { return run_state(); });
  }
  report_.metrics->add_time(saving);
  if (report_.timeline) report_.timeline->end_step(global_step);
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
  record.bad_samples = input_.guard->totals().first;
  const auto forward = model::forward_flops(model_.spec, out.height, out.width);
  // data.class_data_dir: each sample's class image runs through the model too. Some kinds'
  // steps are not counted (SANA-Sprint's: no FLOP/s, no MFU).
  if (kind_->counts_flops()) {
    record.train_flops = train_flops(config::lora_enabled(cfg_.train), model_.spec, forward) *
                         static_cast<double>(out.samples) * (input_.classes ? 2.0 : 1.0);
  }
  record.has_loss = has_loss;
  record.figures = std::move(figures);
  return record;
}

void Trainer::preview_and_evaluate(int64_t global_step, bool epoch_end, int64_t epoch) {
  const bool evaluate = evaluation_.held_out && evaluation_.held_out->due(global_step);
  const bool previews = !evaluation_.previews->due(global_step, run_.total_steps(), epoch_end, epoch).empty();
  if (!evaluate && !previews) {
    evaluation_.previews->publish(report_.metrics->events());
    return;
  }
  EvalWeights eval(update_);  // schedule-free: previews and the held-out loss see its x
  std::optional<EvalResult> r;
  {
    parallel::Zero::Whole whole(*update_.zero);  // stage 3: previews and the held-out loss run the whole model
    evaluation_.previews->maybe_render(global_step, run_.total_steps(), epoch_end, epoch);
    if (evaluate) r = evaluation_.held_out->run(*step_, global_step);  // collective
  }
  eval.restore();
  evaluation_.previews->publish(report_.metrics->events());
  if (!r) return;
  log::info("{}", r->line());
  report_.metrics->record_eval(r->global_step, r->samples, r->loss, r->by_timestep);
}

void Trainer::finish() {
  const int64_t global_step = run_.position().global_step;
  // Schedule-free: the final previews and files hold its x (the last checkpoint, its y).
  EvalWeights eval(update_);
  parallel::Zero::Whole whole(*update_.zero);  // stage 3: previews, the check and the weights see the whole model
  if (cfg_.train.visualize) evaluation_.previews->render(global_step, "end of training");
  const auto sums = rt_.all_gather("final weights checksum", model_.trainable->checksum());
  if (std::adjacent_find(sums.begin(), sums.end(), std::not_equal_to<>()) != sums.end()) {
    throw dist::Disagreement(fmt::format("parameters differ between ranks after step {}: checksums {}", global_step,
                                         fmt::join(sums, ", ")));
  }
  const int world = rt_.world_size();
  log::info("parameters identical on all {} rank{} (checksum {})", world, world == 1 ? "" : "s", sums.front());
  kind_->check_agreement(rt_, global_step);  // collective
  model_.trainable->check_base();
  // every rank's last grids are written: they are past the gather
  evaluation_.previews->publish(report_.metrics->events());
  if (main_rank()) {
    model_.trainable->write_final(cfg_.work_dir, {{"model", model_.spec.name}, {"step", std::to_string(global_step)}});
  }
  if (config::ema_enabled(cfg_.train)) {
    const auto ema = update_.zero->collect("EMA weights", update_.ema->named_averages(), main_rank());  // collective
    if (main_rank()) {
      auto metadata = model_.trainable->file_metadata();
      metadata.insert({{"model", model_.spec.name}, {"ema_rate", fmt::format("{}", update_.ema->rate())}});
      write_safetensors((fs::path(cfg_.work_dir) / "ema.safetensors").string(), ema, metadata);
    }
  }
  const int64_t skipped = update_.nonfinite->skipped() + update_.scaler->overflows();
  report_.metrics->finish(global_step, skipped, stops_.was_stopped());
  const std::string codec = data::codec_warning_summary();
  if (!codec.empty()) log::info("image decoder warnings on this rank (the images decoded): {}", codec);
  if (main_rank()) {
    const auto rep = write_report(cfg_.work_dir);
    if (!rep.error.empty()) log::warn("report: {}", rep.error);
    for (const auto& p : rep.plots) log::info("plot: {}", p);
  }
  checkpointer_->finish();
}

}  // namespace sana::train
