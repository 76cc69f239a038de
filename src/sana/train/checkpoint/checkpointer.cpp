#include "sana/train/checkpoint/checkpointer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "sana/util/log.h"

namespace sana::train {

std::string save_reason(const CheckpointOptions& t, int64_t global_step, int64_t total_steps, bool epoch_end,
                        int64_t epoch, bool stop_requested) {
  if (t.save_model_steps > 0 && global_step % t.save_model_steps == 0) return "train.save_model_steps";
  if (epoch_end && t.save_model_epochs > 0 && (epoch + 1) % t.save_model_epochs == 0) return "train.save_model_epochs";
  if (stop_requested) return "stop request";
  if (global_step == total_steps) return "end of training";
  return "";
}

Checkpointer::Checkpointer(CheckpointOptions options, bool writes) : o_(std::move(options)), writes_(writes) {}

void Checkpointer::add(Stateful& part) {
  const auto name = part.state_name();
  const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (!valid) throw std::invalid_argument(fmt::format("stateful part name '{}': use a-z, 0-9 and _", name));
  for (const auto* p : parts_) {
    if (p->state_name() == name) throw std::invalid_argument(fmt::format("two stateful parts are named '{}'", name));
  }
  parts_.push_back(&part);
}

ckpt::Snapshot Checkpointer::capture(ckpt::TrainerState run) const {
  ckpt::Snapshot snap;
  snap.state = std::move(run);
  for (const auto* p : parts_) snap.parts.emplace_back(p->state_name(), p->save_state());
  return snap;
}

std::optional<ckpt::Snapshot> Checkpointer::gather(const std::function<ckpt::TrainerState()>& run_state) const {
  std::optional<ckpt::Snapshot> snap;
  if (writes_) snap.emplace();
  for (const auto* p : parts_) {
    auto state = p->gather_state(writes_);
    if (snap) snap->parts.emplace_back(p->state_name(), std::move(*state));
  }
  if (snap) snap->state = run_state();
  return snap;
}

void Checkpointer::restore(ckpt::Snapshot& snapshot, const std::string& source) const {
  restore_of(snapshot, source, parts_);
}

void Checkpointer::restore_parts(ckpt::Snapshot& snapshot, const std::string& source,
                                 const std::vector<std::string>& names) const {
  std::vector<Stateful*> chosen;
  for (auto* p : parts_) {
    if (std::find(names.begin(), names.end(), p->state_name()) != names.end()) chosen.push_back(p);
  }
  restore_of(snapshot, source, chosen);
}

void Checkpointer::restore_of(ckpt::Snapshot& snapshot, const std::string& source,
                              const std::vector<Stateful*>& parts) const {
  if (snapshot.state.format >= 3) {
    if (!sharded_) throw std::logic_error("a format-3 checkpoint needs parallel::ShardedCheckpoints to be read");
    sharded_->load(snapshot, source, parts);
  }
  for (auto* p : parts) p->restore_state(snapshot.part(p->state_name()), source);
}

void Checkpointer::maybe_save(const RunPosition& next, int64_t total_steps, bool epoch_end, int64_t epoch,
                              bool stop_requested, const std::function<ckpt::TrainerState()>& run_state) {
  const auto why = save_reason(o_, next.global_step, total_steps, epoch_end, epoch, stop_requested);
  if (!why.empty()) save(next, why, run_state);
}

void Checkpointer::save(const RunPosition& next, const std::string& why,
                        const std::function<ckpt::TrainerState()>& run_state) {
  if (next.global_step == last_saved_) return;
  last_saved_ = next.global_step;
  const auto start = std::chrono::steady_clock::now();
  if (writes_shards_) {
    saver_.wait();  // the previous write (this rank's share of it) is over
    const double previous = saver_.last_write_seconds();
    std::optional<ckpt::TrainerState> run;
    if (writes_) run = run_state();
    saver_.run(sharded_->save_job(parts_, next.global_step, std::move(run), o_.work_dir, o_.keep_last_n,
                                          o_.before_stage));
    if (!o_.async_save) saver_.wait();
    if (writes_) log_save(next, why, start, previous);
    return;
  }
  auto snapshot = gather(run_state);  // every rank: sharded parts gather to the writer
  if (!writes_) return;
  saver_.wait();  // the previous write: its time is read once it has ended (TSan saw the race)
  const double previous = saver_.last_write_seconds();
  saver_.save(o_.work_dir, std::move(*snapshot), o_.keep_last_n, o_.before_stage);
  if (!o_.async_save) saver_.wait();
  log_save(next, why, start, previous);
}

void Checkpointer::log_save(const RunPosition& next, const std::string& why,
                            std::chrono::steady_clock::time_point start, double previous) {
  const double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info("checkpoint {} ({}): the loop waited {:.3f} s{}", ckpt::checkpoint_name(next.global_step), why, blocked,
            o_.async_save ? fmt::format(" (previous write took {:.3f} s in the background)", previous)
                                 : fmt::format(" (synchronous write {:.3f} s)", saver_.last_write_seconds()));
}

void Checkpointer::regroup(std::unique_ptr<parallel::ShardedCheckpoints> sharded) {
  try {
    saver_.wait();
  } catch (const std::exception& e) {
    log::warn("the checkpoint being written when a rank was lost is abandoned: {}", e.what());
  }
  sharded_ = std::move(sharded);
}

void Checkpointer::finish() {
  saver_.wait();
  if (writes_ && last_saved_ >= 0) log::info("checkpoint: {}", saver_.last_path());
}

}  // namespace sana::train
