// The group changing under dist.elastic continue (docs/distributed.md, continuation.h): a
// lost rank's survivors regroup in place (ZeRO stage 0), or hand the whole state, gathered
// from their shares and the lost rank's mirror (stages 1-3), to trainers built anew; a
// group that takes in a replacement hands its state over too (train.cpp's train()).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "sana/train/checkpoint/checkpointer.h"
#include "sana/train/checkpoint/run_state.h"
#include "sana/train/elastic/continuation.h"
#include "sana/train/input/data_guards.h"
#include "sana/train/loop/update.h"
#include "sana/train/report/metrics.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

bool among(const std::vector<int>& ranks, int rank) { return std::count(ranks.begin(), ranks.end(), rank) > 0; }

}  // namespace

GroupParts& Continuation::parts() {
  if (!parts_) throw std::logic_error("train/elastic: Continuation used before attach()");
  return *parts_;
}

bool Continuation::regroup(const std::string& why) {
  auto& p = parts();
  log::warn("{}", why);
  const RunPosition at = p.run.position();
  const std::vector<int> before = rt_.members();
  p.update.reducer->abandon();  // the interrupted step's collectives: not waited for
  const auto r = rt_.regroup(at.global_step);  // collective: the survivors agree
  log::set_rank(rt_.rank(), rt_.world_size());
  // Every survivor decides alike: rank 0's duties are its trainer's, so its loss rebuilds.
  if (mirror_ || options_.deterministic || among(r.lost, before.front())) {
    if (mirror_) check_mirrors(before, r);
    regrouped_ = r;
    return false;
  }
  auto& zero = *p.update.zero;
  zero.regroup();  // the interrupted step's gradients, in buckets the old group may still write
  p.update.optimizer->use_flat_buckets(zero.optimizer_buckets());
  p.checkpointer.regroup(p.update.checkpoint_roles(rt_, options_.timeout_s));  // collective
  p.guard.regroup(rt_.rank() == 0);
  p.follow_group();  // collective
  p.metrics.regrouped(at.global_step, rt_.world_size(), r.lost, r.seconds, r.joined);
  log::info("rank{} {} left the run after step {}: {} of {} ranks go on from there (this one as rank {}); the regroup "
            "took {:.1f} s",
            r.lost.size() == 1 ? "" : "s", fmt::join(r.lost, ", "), at.global_step, rt_.world_size(), r.world_before,
            rt_.rank(), r.seconds);
  if (rt_.world_size() < options_.min_world_size) stop_below_minimum(at.global_step);
  return true;
}

void Continuation::check_mirrors(const std::vector<int>& before, const dist::Runtime::Regrouped& r) const {
  // A lost rank's share is on the member `stride` places on (its mirror); the two lost
  // together leave it nowhere.
  for (size_t i = 0; i < before.size(); ++i) {
    const int holder = before[(i + static_cast<size_t>(mirror_->stride())) % before.size()];
    if (among(r.lost, before[i]) && among(r.lost, holder)) {
      throw RunError(fmt::format(
          "rank {} and rank {}, which kept the mirror of its share (ZeRO stage {}), were both lost after step {}: "
          "no copy of that share is left; resume from the last checkpoint (resume_from: latest, on any number of "
          "ranks)",
          before[i], holder, parts_->update.zero->stage(), parts_->run.position().global_step));
    }
  }
}

void Continuation::note_regroup(const dist::Runtime::Regrouped& r, int64_t step, double rebuild_seconds) {
  auto& p = parts();
  const double seconds = r.lost.empty() ? r.seconds : r.seconds + rebuild_seconds;  // a loss: the rebuild's too
  p.metrics.regrouped(step, rt_.world_size(), r.lost, seconds, r.joined);
  if (!r.joined.empty()) {
    log::info("replacement{} {} joined after step {}: {} ranks go on (this one as rank {}); taking it in took {:.1f} s",
              r.joined.size() == 1 ? "" : "s", fmt::join(r.joined, ", "), step, rt_.world_size(), rt_.rank(),
              r.seconds);
  }
  if (r.lost.empty()) return;
  const char* from = p.update.zero->shards_state() ? "the shares and the lost rank's mirror" : "rank 0's state";
  log::info("rank{} {} left the run after step {}: {} of {} ranks go on from there (this one as rank {}), the "
            "trainers rebuilt from {}; the regroup took {:.1f} s ({:.1f} s in all)",
            r.lost.size() == 1 ? "" : "s", fmt::join(r.lost, ", "), step, rt_.world_size(), r.world_before,
            rt_.rank(), from, r.seconds, seconds);
  if (rt_.world_size() < options_.min_world_size) stop_below_minimum(step);
}

void Continuation::stop_below_minimum(int64_t step) {
  auto& p = parts();
  p.checkpointer.maybe_save(p.run.position(), p.run.total_steps(), false, p.run.position().epoch,
                            /*stop_requested=*/true, p.state);
  p.checkpointer.finish();
  throw RunError(fmt::format("dist.min_world_size: {} rank{} left, fewer than {}: the run stops after step {} with a "
                             "checkpoint in {}; resume_from: latest continues on any number of ranks",
                             rt_.world_size(), rt_.world_size() == 1 ? "" : "s", options_.min_world_size, step,
                             options_.work_dir));
}

std::optional<ckpt::Snapshot> Continuation::hand_over() {
  auto& p = parts();
  if (regrouped_) {
    p.checkpointer.regroup(nullptr);  // a write in flight ends (abandoned if it needed the lost rank)
  } else {
    p.checkpointer.finish();  // a write in flight ends first
  }
  // The group's rank 0 collects: after rank 0's loss another than the trainer's main rank.
  const bool collector = rt_.rank() == 0;
  std::optional<ckpt::Snapshot> snap;
  if (collector) {
    snap.emplace();
    snap->state = p.state();
  }
  const auto& zero = *p.update.zero;
  const auto& sharded = *p.update.sharded;
  const bool shares = zero.shards_state();
  // The ranks lost since this trainer's group formed whose mirror this rank holds.
  const ShareMirror* mirror = mirror_of_lost_partner();
  const auto owned = [&](const std::string& entry) { return zero.owns(entry.substr(0, entry.find('/'))); };
  torch::NoGradGuard no_grad;
  for (auto* part : p.checkpointer.parts()) {
    // Unsharded parts, and every part at stage 0 (every rank has the whole state): the collector's.
    // The optimizer's and the EMA's state go even with ckpt.save_optimizer/save_ema false.
    const bool weights = part == &sharded.weights, optimizer = part == &sharded.optimizer, ema = part == &sharded.ema;
    if (!weights && !optimizer && !ema) {
      if (snap) snap->parts.emplace_back(part->state_name(), part->save_state());
      continue;
    }
    PartState kept;  // rank 0: the part's file metadata and, for the weights, entries of no trained parameter
    NamedTensors mine;  // this rank's share of the trained entries (all of them on rank 0 at stage 0)
    NamedTensors mirrored;  // a lost partner's share, from its mirror
    if (weights) {
      if (collector) kept = part->save_state_of([&](const std::string& e) { return !zero.is_parameter_entry(e); });
      if (shares || collector) mine = *part->save_state_of(owned).tensors;
      if (mirror) mirrored = mirror->parameters();
    } else if (optimizer) {
      if (shares || collector) {  // even with ckpt.save_optimizer false (not save_state())
        for (const auto& [name, t] : p.update.optimizer->state()) {
          mine.emplace_back(name, t.detach().to(torch::kCPU).clone());
        }
      }
      if (mirror) mirrored = mirror->optimizer_state();
    } else {
      if (collector) kept = {nullptr, NamedTensors{}, p.update.ema->save_state().metadata};
      if (shares || collector) mine = p.update.ema->named_averages();
      if (mirror) mirrored = mirror->averages();
    }
    mine.insert(mine.end(), mirrored.begin(), mirrored.end());
    if (kept.tensors) mine.insert(mine.begin(), kept.tensors->begin(), kept.tensors->end());
    auto all = zero.collect("whole state " + part->state_name(), std::move(mine), collector);  // collective
    if (snap) snap->parts.emplace_back(part->state_name(), PartState{kept.json, std::move(all), kept.metadata});
  }
  return snap;
}

const ShareMirror* Continuation::mirror_of_lost_partner() const {
  if (!regrouped_ || !mirror_ || !among(regrouped_->lost, mirror_->partner())) return nullptr;
  return mirror_.get();
}

}  // namespace sana::train
