// The run in its checkpoints (docs/checkpoints.md): the parts a checkpoint holds, the
// run's own position and metadata saved beside them, and the resume that restores both
// (with a batch or world size that changed since).
#include <fmt/format.h>

#include <chrono>

#include "sana/ckpt/checkpoint.h"
#include "sana/config/loader.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/elastic/peer_state.h"
#include "sana/train/checkpoint/resume.h"
#include "sana/train/loop/trainer.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

// What a checkpoint holds besides the run's position: one line per part (its name is the
// part's own: model, ema and optimizer tensors, and JSON), and under ckpt.format 3 who
// writes and reads each entry (a collective).
void Trainer::register_checkpointed_parts() {
  // Format-3 checkpoints are read so whatever ckpt.format this run writes (a resume after
  // switching to format 2, model.load_from's optimizer state).
  checkpointer_->use_shards(update_.checkpoint_roles(rt_, cfg_.dist.timeout_s), cfg_.ckpt.format >= 3);  // collective
  update_.sharded.emplace(model_.trainable->checkpoint_part(), *update_.ema, *update_.optimizer, rt_, *update_.zero);
  checkpointer_->add(update_.sharded->weights);
  checkpointer_->add(update_.sharded->ema);
  checkpointer_->add(update_.sharded->optimizer);
  checkpointer_->add(*update_.reducer);
  checkpointer_->add(*input_.guard);
  checkpointer_->add(*update_.nonfinite);
  checkpointer_->add(*update_.scaler);
  checkpointer_->add(*update_.lr_scheduler);
  for (auto* part : kind_->parts()) checkpointer_->add(*part);
}

void Trainer::change_batch(const ckpt::TrainerState& saved) {
  const auto spec = batch_spec_for(cfg_);
  run_.rebatch();
  if (cfg_.data.sampler == config::DataSampler::distributed && run_.position().step_in_epoch > 0) {
    throw UsageError(fmt::format("data.sampler distributed cannot change {} mid-epoch (torch's DistributedSampler "
                                 "partition has no rest of an epoch); resume at an epoch end or with data.sampler bucket",
                                 before_text(saved)),
                     "config error");
  }
  const auto plan = epoch_plan(run_.position().epoch);
  check_world_fits(plan, rt_.world_size(), spec);
  log::info("{} -> {}: epoch {}'s samples not yet seen are batched anew from its step {} ({} steps left in it), "
            "later epochs too",
            before_text(saved), spec.describe(), run_.position().epoch + 1, run_.position().step_in_epoch + 1,
            plan.steps() - run_.position().step_in_epoch);
  if (cfg_.train.auto_lr != config::AutoLr::none) {
    const auto& now = update_.lr_scheduler->options();
    auto old = now;
    old.global_batch_size = saved.global_batch_size;
    log::info("train.auto_lr {}: the learning rate follows the batch: {:.4g} -> {:.4g}", config::name_of(cfg_.train.auto_lr),
              peak_learning_rate(old), peak_learning_rate(now));
  }
}

void Trainer::resume() {
  std::string source;
  const auto start = std::chrono::steady_clock::now();
  std::optional<ckpt::Snapshot> snapshot;
  std::vector<std::string> damaged;  // found so while read: latest goes on to the one before
  for (;;) {
    snapshot = read_resume_checkpoint(resume_options_for(cfg_, model_.spec.name), rt_, source, damaged);  // collective
    if (!snapshot) return;
    try {
      checkpointer_->restore(*snapshot, source);  // collective
      break;
    } catch (const ckpt::DamagedCheckpoint& e) {
      if (cfg_.resume_from != "latest") {
        throw ckpt::CheckpointError(fmt::format("resume_from {}: {}. Name an older checkpoint folder, or set "
                                                "resume_from: latest to pass over damaged ones",
                                                source, e.what()));
      }
      log::warn_shared("resume_from latest: skipping {}: {}", source, e.what());
      damaged.push_back(source);
    }
  }
  const auto& s = snapshot->state;
  continue_at(s);
  log::info("resumed from {} (saved on {} process{}): epoch {} step {}, global step {}, in {:.2f} s", source,
            s.world_size, s.world_size == 1 ? "" : "es", s.position.epoch + 1, s.position.step_in_epoch,
            s.position.global_step,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  log_config_changes(s);
  restart_schedule_if_asked();
}

void Trainer::continue_at(const ckpt::TrainerState& s) {
  if (run_.continue_at(s)) change_batch(s);
}

void Trainer::resume_from_peers() {
  const auto start = std::chrono::steady_clock::now();
  auto snapshot = share_snapshot(rt_, elastic_.carried());  // collective
  checkpointer_->restore(snapshot, "rank 0's state");
  continue_at(snapshot.state);
  log::info("took the run's state from rank 0 (global step {}, epoch {} step {}) in {:.2f} s", run_.position().global_step,
            run_.position().epoch + 1, run_.position().step_in_epoch,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// train.resume_lr_scheduler false: as upstream's train.py, only a resume from a named
// checkpoint starts the schedule again; resume_from latest (a run continuing after a stop
// or a failure) always continues it.
void Trainer::restart_schedule_if_asked() {
  if (cfg_.train.resume_lr_scheduler) return;
  if (cfg_.resume_from == "latest") {
    log::info("train.resume_lr_scheduler false: resume_from latest continues the learning-rate schedule (only a "
              "resume from a named checkpoint restarts it, as upstream's train.py)");
    return;
  }
  update_.lr_scheduler->restart();
  log::info("train.resume_lr_scheduler false: the learning-rate schedule starts again at global step {} (warm-up "
            "included)",
            run_.position().global_step + 1);
}

void Trainer::carry_over_load_from() {
  const auto& t = cfg_.train;
  if (!t.load_from_optimizer && !t.load_from_lr_scheduler) return;
  const std::string keys = t.load_from_optimizer && t.load_from_lr_scheduler ? "train.load_from_optimizer and "
                                                                               "load_from_lr_scheduler"
                           : t.load_from_optimizer ? "train.load_from_optimizer"
                                                   : "train.load_from_lr_scheduler";
  if (cfg_.resume_from != "latest" || cfg_.model.load_from.empty()) {
    log::warn_shared("{} act only when resume_from latest finds no checkpoint and model.load_from is set (as upstream's "
                     "train.py reads them); this run starts without them",
                     keys);
    return;
  }
  const auto folder = ckpt::checkpoint_folder_of(cfg_.model.load_from);  // the config check made sure of it
  auto snapshot = ckpt::read_checkpoint(folder, /*tensors=*/false);       // format 3: the Checkpointer reads its share
  if (t.load_from_optimizer) {
    checkpointer_->restore_parts(snapshot, folder, {update_.sharded->optimizer.state_name()});  // collective (format 3)
    log::info("train.load_from_optimizer: the optimizer state of {} (its step {})", folder,
              snapshot.state.position.global_step);
  }
  if (t.load_from_lr_scheduler) {
    const int64_t at = LrScheduler::saved_position(snapshot.part(update_.lr_scheduler->state_name()),
                                                    snapshot.state.position.global_step);
    update_.lr_scheduler->continue_at(at);
    log::info("train.load_from_lr_scheduler: the learning-rate schedule continues at its step {}, as {} left it", at,
              folder);
  }
}

// What a resume changed, key by key (any key may change but train.seed and the model;
// resume_from itself is not a change).
void Trainer::log_config_changes(const ckpt::TrainerState& saved) const {
  if (saved.config.empty()) {
    if (saved.config_hash != config::config_fingerprint(cfg_)) {
      log::info("the config differs from the checkpoint's (written by a sana-train that kept no values to compare)");
    }
    return;
  }
  auto before = saved.config;
  auto now = config::config_values(cfg_);
  before.erase("resume_from");
  now.erase("resume_from");
  const auto changes = config::config_changes(before, now);
  if (changes.empty()) return;
  log::info("the config differs from the checkpoint's in {} key{}:", changes.size(), changes.size() == 1 ? "" : "s");
  for (const auto& change : changes) log::info("  {}", change);
}

ckpt::TrainerState Trainer::run_state() const {
  ckpt::TrainerState st;  // the run's identity; RunState adds where it stands
  st.seed = cfg_.train.seed;
  st.world_size = rt_.world_size();
  st.model = model_.spec.name;
  st.config_hash = config::config_fingerprint(cfg_);
  st.config = config::config_values(cfg_);
  return run_.saved(std::move(st));
}

}  // namespace sana::train
