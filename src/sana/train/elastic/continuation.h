// dist.elastic continue inside one trainer (docs/distributed.md): what keeps a committed
// step whole when a rank is lost during it, and what ends the trainer early so that the
// group it becomes goes on. The regroup itself and the hand-over of the whole state are
// trainer_groups.cpp's; train.cpp builds the next trainer.
//
// Owns: where the trainer's state comes from (a checkpoint, or rank 0's state handed over
// from the trainer before it), the mirror of another rank's share (ZeRO stages 1-3:
// share_mirror.h), a loss met after a step's commit, a replacement waiting to come in, and
// the survivors' regroup that ends the trainer.
// Never: decides a step (the step agreement does) or rebuilds the group.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "sana/ckpt/checkpoint.h"
#include "sana/distributed/runtime.h"
#include "sana/train/elastic/share_mirror.h"
#include "sana/train/optim/ema.h"
#include "sana/train/optim/optimizer.h"

namespace sana::train {

class Continuation {
 public:
  // `carried`: rank 0's state from the trainer before this one (elastic/peer_state.h), on
  // rank 0 of a group that was handed it; null elsewhere. `from_peers`: this trainer's
  // state comes from rank 0's (a group just formed), not from resume_from.
  Continuation(dist::Runtime& rt, bool from_peers, const ckpt::Snapshot* carried)
      : rt_(rt), from_peers_(from_peers), carried_(carried) {}

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
  // The survivors of a loss re-formed (`r`) and this trainer hands the run over to one built
  // for them (ZeRO's shares, train.deterministic, rank 0 lost).
  void hand_over_after(const dist::Runtime::Regrouped& r) { regrouped_ = r; }
  const std::optional<dist::Runtime::Regrouped>& regrouped() const { return regrouped_; }

 private:
  dist::Runtime& rt_;
  const bool from_peers_;
  const ckpt::Snapshot* carried_;
  std::unique_ptr<ShareMirror> mirror_;
  std::optional<std::string> lost_after_commit_;
  bool taking_in_ = false;
  std::optional<dist::Runtime::Regrouped> regrouped_;
};

}  // namespace sana::train
