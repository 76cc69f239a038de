// `sana-train --config C` (train.h): one Trainer per group of processes. Under dist.elastic
// continue a group that loses a rank or takes in a replacement hands its state to a Trainer
// built for the new group (elastic/continuation.h, docs/distributed.md).
#include "sana/train/train.h"

#include <chrono>

#include "sana/config/loader.h"
#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/loop/trainer.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

int train(const config::Config& cfg, const dist::LaunchEnv& env, const TestHooks& hooks) {
  check_training_kind(cfg);
  auto rt = dist::Runtime::start(env, runtime_options_for(cfg, hooks), {SANA_VERSION, config::config_fingerprint(cfg)},
                                 dist::flight_record_dir(cfg.work_dir));
  try {
    // dist.elastic continue: a group that takes in a replacement builds its trainers anew,
    // the state handed from rank 0 (a replacement starts so).
    bool from_peers = env.join_id >= 0;
    if (from_peers) log::set_rank(rt->rank(), rt->world_size());  // its place in the group it joined
    std::optional<ckpt::Snapshot> carried;
    std::optional<dist::Runtime::Regrouped> changed;
    int64_t changed_after = 0;
    std::chrono::steady_clock::time_point change_began;
    for (;;) {
      // Chosen anew for each group: the state each rank keeps follows the group's size.
      const config::Config run_cfg = with_micro_batch_chosen(cfg, *rt);
      Continuation group(*rt, continuation_options_for(run_cfg), from_peers, carried ? &*carried : nullptr);
      Trainer trainer(run_cfg, *rt, hooks, group);
      carried.reset();
      if (changed) {
        group.note_regroup(*changed, changed_after,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - change_began).count());
      }
      if (trainer.run()) break;
      change_began = std::chrono::steady_clock::now();
      carried = group.hand_over();  // collective
      changed_after = trainer.global_step();
      changed = group.regrouped();  // a loss the group could not take in place: the survivors have re-formed
      if (!changed) changed = rt->admit();  // collective: the group with its replacements
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

}  // namespace sana::train
