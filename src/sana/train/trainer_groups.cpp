// The run across groups (train/train.h's train()), and the trainer when its group changes
// under dist.elastic continue (docs/distributed.md): a lost rank's survivors regroup in
// place; a group that takes in a replacement builds its trainers anew from rank 0's state.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sana/config/loader.h"
#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/model/spec.h"
#include "sana/train/component_options.h"
#include "sana/train/part_options.h"
#include "sana/train/trainer.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

int train(const config::Config& cfg, const dist::LaunchEnv& env) {
  if (model_spec_for(cfg).trigflow && cfg.model.sprint.teacher_model.empty()) {  // SANA-Sprint's stage 2
    throw UsageError(fmt::format("model.teacher_model: is empty, and {} is SANA-Sprint's stage-2 student: stage 2 "
                                 "distils a teacher; point it at the stage-1 fine-tune's weights (docs/sprint.md)",
                                 cfg.model.model),
                     "config error");
  }
  auto rt = dist::Runtime::start(env, runtime_options_for(cfg), {SANA_VERSION, config::config_fingerprint(cfg)},
                                 dist::flight_record_dir(cfg.work_dir));
  try {
    // dist.elastic continue: a group that takes in a replacement builds its trainers anew,
    // the state handed from rank 0 (a replacement starts so).
    bool from_peers = env.join_id >= 0;
    if (from_peers) log::set_rank(rt->rank(), rt->world_size());  // its place in the group it joined
    std::optional<ckpt::Snapshot> carried;
    std::optional<dist::Runtime::Regrouped> grown;
    int64_t grown_after = 0;
    for (;;) {
      Trainer trainer(cfg, *rt, from_peers, carried ? &*carried : nullptr);
      carried.reset();
      if (grown) trainer.note_growth(*grown, grown_after);
      if (trainer.run()) break;
      carried = trainer.hand_over();
      grown_after = trainer.global_step();
      grown = rt->admit();  // collective: the group with its replacements
      log::set_rank(rt->rank(), rt->world_size());
      from_peers = true;
    }
    rt->finish();
    return kExitOk;
  } catch (const dist::PeerFailure& e) {
    dist::FlightRecorder::process().dump(e.what());
    throw;  // another rank failed first: it has told everyone
  } catch (const std::exception& e) {
    rt->fail(dist::short_error(e));  // the others stop now, not at their next collective's timeout
    throw;
  }
}

std::optional<ckpt::Snapshot> Trainer::hand_over() {
  checkpointer_->finish();  // a write in flight ends first
  if (!main_rank_) return std::nullopt;
  return checkpointer_->capture(run_state());
}

void Trainer::note_growth(const dist::Runtime::Regrouped& r, int64_t step) {
  metrics_->regrouped(step, rt_.world_size(), r.lost, r.seconds, r.joined);
  log::info("replacement{} {} joined after step {}: {} ranks go on (this one as rank {}); taking it in took {:.1f} s",
            r.joined.size() == 1 ? "" : "s", fmt::join(r.joined, ", "), step, rt_.world_size(), rt_.rank(),
            r.seconds);
}

void Trainer::regroup(const std::string& why) {
  log::warn("{}", why);
  const RunPosition at = position_;
  const auto r = rt_.regroup(at.global_step);  // collective: the survivors agree
  log::set_rank(rt_.rank(), rt_.world_size());
  zero_->regroup();  // the interrupted step's gradients, in buckets the old group may still write
  optimizer_->use_flat_buckets(zero_->optimizer_buckets());
  checkpointer_->regroup(sharded_checkpoints());  // collective
  guard_->regroup(rt_.rank() == 0);
  step_.emplace(step_options_for(cfg_, rt_.rank(), rt_.world_size(), zero_->forwards_collective()), model_, encoders_,
                *reducer_);
  if (eval_) {
    eval_.reset();
    open_eval_set();  // collective: its loader's share of the new group
  }
  metrics_->regrouped(at.global_step, rt_.world_size(), r.lost, r.seconds, r.joined);
  log::info("rank{} {} left the run after step {}: {} of {} ranks go on from there (this one as rank {}); the regroup "
            "took {:.1f} s",
            r.lost.size() == 1 ? "" : "s", fmt::join(r.lost, ", "), at.global_step, rt_.world_size(), r.world_before,
            rt_.rank(), r.seconds);
  if (rt_.world_size() >= cfg_.dist.min_world_size) return;
  checkpointer_->maybe_save(position_, total_steps_, false, position_.epoch, /*stop_requested=*/true,
                            [this] { return run_state(); });
  checkpointer_->finish();
  throw RunError(fmt::format("dist.min_world_size: {} rank{} left, fewer than {}: the run stops after step {} with a "
                             "checkpoint in {}; resume_from: latest continues on any number of ranks",
                             rt_.world_size(), rt_.world_size() == 1 ? "" : "s", cfg_.dist.min_world_size,
                             at.global_step, cfg_.work_dir));
}

}  // namespace sana::train
