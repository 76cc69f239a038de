// The trainer when its group changes under dist.elastic continue (docs/distributed.md): a
// lost rank's survivors regroup in place (ZeRO stage 0), or build their trainers anew from
// the whole state gathered from their shares and the lost rank's mirror (stages 1-3); a
// group that takes in a replacement builds its trainers anew from the whole state too
// (train.cpp's train()).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/loop/trainer.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

std::optional<ckpt::Snapshot> Trainer::hand_over() {
  if (elastic_.regrouped()) {
    checkpointer_->regroup(nullptr);  // a write in flight ends (abandoned if it needed the lost rank)
  } else {
    checkpointer_->finish();  // a write in flight ends first
  }
  return whole_state();  // collective
}

std::optional<ckpt::Snapshot> Trainer::whole_state() {
  // The group's rank 0 collects: after rank 0's loss another than this trainer's main rank.
  const bool collector = rt_.rank() == 0;
  std::optional<ckpt::Snapshot> snap;
  if (collector) {
    snap.emplace();
    snap->state = run_state();
  }
  const bool sharded = zero_->shards_state();
  // The ranks lost since this trainer's group formed whose mirror this rank holds.
  const ShareMirror* mirror = elastic_.mirror();
  const auto& regrouped = elastic_.regrouped();
  const bool mirror_of_lost =
      regrouped && mirror && std::count(regrouped->lost.begin(), regrouped->lost.end(), mirror->partner()) > 0;
  const auto owned = [this](const std::string& entry) { return zero_->owns(entry.substr(0, entry.find('/'))); };
  torch::NoGradGuard no_grad;
  for (auto* part : checkpointer_->parts()) {
    // Unsharded parts, and every part at stage 0 (every rank has the whole state): the collector's.
    // The optimizer's and the EMA's state go even with ckpt.save_optimizer/save_ema false.
    const bool weights = part == &sharded_->weights, optimizer = part == &sharded_->optimizer,
               ema = part == &sharded_->ema;
    if (!weights && !optimizer && !ema) {
      if (snap) snap->parts.emplace_back(part->state_name(), part->save_state());
      continue;
    }
    PartState kept;  // rank 0: the part's file metadata and, for the weights, entries of no trained parameter
    NamedTensors mine;  // this rank's share of the trained entries (all of them on rank 0 at stage 0)
    if (weights) {
      if (collector) {
        kept = part->save_state_of([&](const std::string& e) { return !zero_->is_parameter_entry(e); });
      }
      if (sharded || collector) mine = *part->save_state_of([&](const std::string& e) { return owned(e); }).tensors;
      if (mirror_of_lost) {
        const auto more = mirror->parameters();
        mine.insert(mine.end(), more.begin(), more.end());
      }
    } else if (optimizer) {
      if (sharded || collector) {
        for (const auto& [name, t] : optimizer_->state()) mine.emplace_back(name, t.detach().to(torch::kCPU).clone());
      }
      if (mirror_of_lost) {
        const auto more = mirror->optimizer_state();
        mine.insert(mine.end(), more.begin(), more.end());
      }
    } else {
      if (collector) kept = {nullptr, NamedTensors{}, ema_->save_state().metadata};
      if (sharded || collector) mine = ema_->named_averages();
      if (mirror_of_lost) {
        const auto more = mirror->averages();
        mine.insert(mine.end(), more.begin(), more.end());
      }
    }
    if (kept.tensors) mine.insert(mine.begin(), kept.tensors->begin(), kept.tensors->end());
    auto all = zero_->collect("whole state " + part->state_name(), std::move(mine), collector);  // collective
    if (snap) snap->parts.emplace_back(part->state_name(), PartState{kept.json, std::move(all), kept.metadata});
  }
  return snap;
}

void Trainer::note_regroup(const dist::Runtime::Regrouped& r, int64_t step, double rebuild_seconds) {
  const double seconds = r.lost.empty() ? r.seconds : r.seconds + rebuild_seconds;  // a loss: the rebuild's too
  metrics_->regrouped(step, rt_.world_size(), r.lost, seconds, r.joined);
  if (!r.joined.empty()) {
    log::info("replacement{} {} joined after step {}: {} ranks go on (this one as rank {}); taking it in took {:.1f} s",
              r.joined.size() == 1 ? "" : "s", fmt::join(r.joined, ", "), step, rt_.world_size(), rt_.rank(),
              r.seconds);
  }
  if (r.lost.empty()) return;
  log::info("rank{} {} left the run after step {}: {} of {} ranks go on from there (this one as rank {}), the "
            "trainers rebuilt from {}; the regroup took {:.1f} s ({:.1f} s in all)",
            r.lost.size() == 1 ? "" : "s", fmt::join(r.lost, ", "), step, rt_.world_size(), r.world_before,
            rt_.rank(), zero_->shards_state() ? "the shares and the lost rank's mirror" : "rank 0's state", r.seconds,
            seconds);
  if (rt_.world_size() < cfg_.dist.min_world_size) stop_below_minimum(step);
}

bool Trainer::regroup(const std::string& why) {
  log::warn("{}", why);
  const RunPosition at = run_.position();
  const std::vector<int> before = rt_.members();
  reducer_->abandon();  // the interrupted step's collectives: not waited for
  const auto r = rt_.regroup(at.global_step);  // collective: the survivors agree
  log::set_rank(rt_.rank(), rt_.world_size());
  // Every survivor decides alike: rank 0's duties are its trainer's, so its loss rebuilds.
  const bool main_lost = std::count(r.lost.begin(), r.lost.end(), before.front()) > 0;
  if (elastic_.mirror() || cfg_.train.deterministic || main_lost) {
    if (elastic_.mirror()) check_mirrors(before, r);
    elastic_.hand_over_after(r);
    return false;
  }
  zero_->regroup();  // the interrupted step's gradients, in buckets the old group may still write
  optimizer_->use_flat_buckets(zero_->optimizer_buckets());
  checkpointer_->regroup(sharded_checkpoints());  // collective
  guard_->regroup(rt_.rank() == 0);
  step_.emplace(step_options_for(cfg_, hooks_, rt_.rank(), rt_.world_size(), zero_->forwards_collective()), model_,
                encoders_, *reducer_);
  if (eval_) {
    eval_.reset();
    open_eval_set();  // collective: its loader's share of the new group
  }
  metrics_->regrouped(at.global_step, rt_.world_size(), r.lost, r.seconds, r.joined);
  log::info("rank{} {} left the run after step {}: {} of {} ranks go on from there (this one as rank {}); the regroup "
            "took {:.1f} s",
            r.lost.size() == 1 ? "" : "s", fmt::join(r.lost, ", "), at.global_step, rt_.world_size(), r.world_before,
            rt_.rank(), r.seconds);
  if (rt_.world_size() < cfg_.dist.min_world_size) stop_below_minimum(at.global_step);
  return true;
}

void Trainer::check_mirrors(const std::vector<int>& before, const dist::Runtime::Regrouped& r) const {
  // A lost rank's share is on the member `stride` places on (its mirror); the two lost
  // together leave it nowhere.
  const auto lost = [&](int member) { return std::count(r.lost.begin(), r.lost.end(), member) > 0; };
  for (size_t i = 0; i < before.size(); ++i) {
    const int holder = before[(i + static_cast<size_t>(elastic_.mirror()->stride())) % before.size()];
    if (lost(before[i]) && lost(holder)) {
      throw RunError(fmt::format(
          "rank {} and rank {}, which kept the mirror of its share (ZeRO stage {}), were both lost after step {}: "
          "no copy of that share is left; resume from the last checkpoint (resume_from: latest, on any number of "
          "ranks)",
          before[i], holder, zero_->stage(), run_.position().global_step));
    }
  }
}

void Trainer::stop_below_minimum(int64_t step) {
  checkpointer_->maybe_save(run_.position(), total_steps_, false, run_.position().epoch, /*stop_requested=*/true,
                            [this] { return run_state(); });
  checkpointer_->finish();
  throw RunError(fmt::format("dist.min_world_size: {} rank{} left, fewer than {}: the run stops after step {} with a "
                             "checkpoint in {}; resume_from: latest continues on any number of ranks",
                             rt_.world_size(), rt_.world_size() == 1 ? "" : "s", cfg_.dist.min_world_size, step,
                             cfg_.work_dir));
}

}  // namespace sana::train
