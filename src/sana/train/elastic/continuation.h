// dist.elastic continue (docs/distributed.md): the layer between a trainer and the group
// of processes it runs on. Inside one trainer: what keeps a committed step whole when a
// rank is lost during it, the survivors' regroup (in place, or ending the trainer), and
// the hand-over of the whole state to the trainer built for the next group (train.cpp).
// The trainer sees a group and a position; this layer sees the group change.
//
// Owns: where the trainer's state comes from (a checkpoint, or rank 0's state handed over
// from the trainer before it), the mirror of another rank's share (ZeRO stages 1-3:
// share_mirror.h), a loss met after a step's commit, a replacement waiting to come in, the
// regroup and what follows the group in place (regroup.cpp), and the hand-over.
// Never: decides a step (the step agreement does), builds a trainer (train.cpp does) or
// reads the config (its options come in).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sana/ckpt/checkpoint.h"
#include "sana/distributed/runtime.h"
#include "sana/train/elastic/share_mirror.h"
#include "sana/train/optim/ema.h"
#include "sana/train/optim/optimizer.h"

namespace sana::train {

struct Update;
class Checkpointer;
class BadSampleGuard;
class Metrics;
class RunState;

struct ContinuationOptions {
  int64_t min_world_size = 1;  // dist.min_world_size: fewer ranks after a loss stop the run
  bool deterministic = false;  // train.deterministic: its integer gradient sums start anew in a new trainer
  double timeout_s = 0;        // dist.timeout_s: the waits of a sharded checkpoint's roles
  std::string work_dir;        // where the stop below min_world_size leaves its checkpoint
};

// The trainer's parts a regroup and a hand-over work on, once the trainer has built them.
struct GroupParts {
  Update& update;
  Checkpointer& checkpointer;
  BadSampleGuard& guard;
  Metrics& metrics;
  const RunState& run;
  std::function<ckpt::TrainerState()> state;  // the run's trainer_state.json as it stands
  // The parts built for the group's ranks, built again for the group re-formed in place:
  // the step's share of each batch and the held-out loader (a collective).
  std::function<void()> follow_group;
};

class Continuation {
 public:
  // `carried`: rank 0's state from the trainer before this one (elastic/peer_state.h), on
  // rank 0 of a group that was handed it; null elsewhere. `from_peers`: this trainer's
  // state comes from rank 0's (a group just formed), not from resume_from.
  Continuation(dist::Runtime& rt, ContinuationOptions options, bool from_peers, const ckpt::Snapshot* carried)
      : rt_(rt), options_(std::move(options)), from_peers_(from_peers), carried_(carried) {}
  // Once the trainer has built them: the parts a regroup and a hand-over work on.
  void attach(GroupParts parts) { parts_.emplace(std::move(parts)); }

  bool from_peers() const { return from_peers_; }
  const ckpt::Snapshot* carried() const { return carried_; }

  // The sharded state is mirrored (`mirror`, seeded from this rank's `optimizer` and `ema`:
  // a collective), so the survivors of a loss rebuild every share.
  void mirror_shares(std::unique_ptr<ShareMirror> mirror, const Optimizer& optimizer, const Ema& ema);
  // The mirror, or null (no sharded state, or not elastic).
  const ShareMirror* mirror() const { return mirror_.get(); }

  // Before the step's commit: the mirror takes its partner's reduced gradients (a
  // collective at ZeRO stages 2 and 3).
  void before_commit();
  // After the commit, the step on the mirror as its owner takes it: an overflowed step's
  // EMA, or an applied step (the gradients unscaled and clipped, the EMA, the optimizer).
  void overflowed(int64_t step);
  void applied(int64_t step, double lr, double grad_norm, double loss_scale, double clip);
  // A rank lost in the committed step's update (ZeRO's share of it, a collective): with a
  // mirror the loss is kept for raise_lost(), every share and mirror having the step;
  // without one it is thrown on. Call it from the handler of `lost`.
  void lost_in_update(const dist::RankLost& lost);
  // Once the step's position has moved: the loss commit() met, raised (dist::RankLost).
  void raise_lost() const;
  // After the step's checkpoint: whether a replacement waits to come in (Runtime::joining)
  // and no stop was asked; then the trainer ends and a new one takes the group in.
  bool take_in_replacements(bool stop_requested);
  bool taking_in() const { return taking_in_; }
  // After a lost rank (`why`, met after the trainer's last committed step): the survivors
  // re-form (a collective). At ZeRO stage 0 with rank 0 kept, in place (true): the parts
  // tied to the group follow (the step's gradients discarded, ZeRO's buckets, the
  // checkpoint roles, the guard, GroupParts::follow_group); weights, optimizer, EMA and
  // position stay as the last committed step left them. Else (false, regrouped() set) the
  // trainer ends and the run goes on in one built for the new group: at ZeRO stages 1-3 (a
  // share to take from its mirror; RunError when the mirror was lost with it), with
  // train.deterministic (whose integer gradient sums start anew), and when rank 0 was lost
  // (its duties: metrics, checkpoints, the report). Below dist.min_world_size: a
  // checkpoint, then RunError.
  bool regroup(const std::string& why);
  // The survivors of a loss re-formed and the trainer ends (regroup() returned false).
  const std::optional<dist::Runtime::Regrouped>& regrouped() const { return regrouped_; }
  // In a trainer built for a group that changed (`r`, after step `step`; `rebuild_seconds`
  // since the loss, the rebuild included): the log and metrics.jsonl say so. Below
  // dist.min_world_size after a loss: a checkpoint, then RunError.
  void note_regroup(const dist::Runtime::Regrouped& r, int64_t step, double rebuild_seconds);
  // After the trainer ended early: the run's whole state at the last committed step on the
  // group's rank 0 (its checkpoint write finished first), gathered from every rank's share
  // and, for a lost rank, from its mirror (a collective); nothing on the other ranks.
  std::optional<ckpt::Snapshot> hand_over();

 private:
  // The regroup at ZeRO stages 1-3: RunError when a lost rank's mirror was lost with it
  // (`before`: the group's members before it).
  void check_mirrors(const std::vector<int>& before, const dist::Runtime::Regrouped& r) const;
  [[noreturn]] void stop_below_minimum(int64_t step);
  // After a regroup that ends the trainer: the mirror this rank holds of a rank lost in it.
  const ShareMirror* mirror_of_lost_partner() const;
  GroupParts& parts();

  dist::Runtime& rt_;
  const ContinuationOptions options_;
  std::optional<GroupParts> parts_;
  const bool from_peers_;
  const ckpt::Snapshot* carried_;
  std::unique_ptr<ShareMirror> mirror_;
  std::optional<std::string> lost_after_commit_;
  bool taking_in_ = false;
  std::optional<dist::Runtime::Regrouped> regrouped_;
};

}  // namespace sana::train
