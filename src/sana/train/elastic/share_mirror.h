// dist.elastic continue under ZeRO (docs/distributed.md, "Sharded state"): each rank keeps
// a mirror of another rank's share of the sharded state (its trained parameters, their
// optimizer state and EMA; rank r keeps rank r - s's, the stride s putting it on another
// node where the group spans several: mirror_stride) and applies every step to it as the
// owner does, with the owner's reduced gradients: its own copy of them at stage 1, where
// every rank has them all, sent by the owner before the step's commit at stages 2 and 3.
// A committed step is therefore on the mirror too whatever the moment of a loss, and an
// uncommitted one on neither. The survivors of a lost rank rebuild the run from their
// shares and the lost one's mirror (Trainer::whole_state); a rank lost with the one that
// mirrors it leaves no copy of its share: the run stops with a message and resumes from
// its last checkpoint.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sana/distributed/runtime.h"
#include "sana/parallel/reducer.h"
#include "sana/parallel/zero.h"
#include "sana/train/optim/ema.h"
#include "sana/train/optim/optimizer.h"

namespace sana::train {

// The stride s of the mirrors (rank r mirrors rank (r - s) mod W's share) for a group
// whose ranks run on `nodes` (Runtime::member_nodes): the s in 1..W-1 that puts the most
// shares' mirrors on another node than their owner, the smallest of equals (1 on one
// node). Ranks numbered node by node, c on each: s = c, and a whole node lost leaves a
// mirror of every share it held.
int mirror_stride(const std::vector<std::string>& nodes);

class ShareMirror {
 public:
  // The mirror of the share of rank (rank - stride) mod W, laid out as its owner lays it out
  // (parallel::Zero::share_of), with an optimizer and an EMA like the owner's. Its values
  // come with seed().
  ShareMirror(dist::Runtime& rt, const parallel::Zero& zero, const parallel::Reducer& reducer,
              const OptimizerOptions& optimizer, double ema_rate, EmaPlacement ema_placement);

  // The original rank (launcher's numbering) whose share this is.
  int partner() const { return partner_; }
  // The group's mirror_stride: every rank's share is mirrored `stride` ranks on.
  int stride() const { return stride_; }
  // Every rank's share (parameters, optimizer state, EMA) to the rank that mirrors it: once
  // the run's state is restored. Collective.
  void seed(const Optimizer& own_optimizer, const Ema& own_ema);
  // Before the step's commit: the partner's reduced gradients, sent by it (stages 2 and 3:
  // a collective every rank joins) or copied from this rank's whole ones (stage 1).
  void take_gradients();
  // After the commit, what the owner does with its share: the EMA at an overflowed step,
  // and at an applied one the gradients unscaled and clipped (by the agreed norm), the EMA
  // and the optimizer step.
  void update_ema_at(int64_t step);
  void apply_step(int64_t step, double lr, double grad_norm, double loss_scale, double clip);

  // The partner's share as checkpoint entries (CPU copies): "<parameter>" values, optimizer
  // state "<parameter>/<state>", EMA averages "<parameter>".
  NamedTensors parameters() const;
  NamedTensors optimizer_state() const;
  NamedTensors averages() const;
  // Memory the mirror holds: parameters, gradients, optimizer state and EMA.
  int64_t bytes() const;

 private:
  struct Segment {
    size_t bucket = 0, segment = 0;
    int64_t offset = 0, numel = 0;  // in the mirror's flat storage
  };
  dist::Runtime& rt_;
  const parallel::Zero& zero_;
  const parallel::Reducer& reducer_;
  int stride_ = 1, successor_ = 0, predecessor_ = 0, partner_ = 0;
  std::vector<Segment> own_, mirrored_;  // this rank's segments (sent), the partner's (kept)
  int64_t own_numel_ = 0;
  torch::Tensor values_, grads_;  // the partner's segments, end to end
  NamedParams params_;            // its parameters: views of values_, gradients views of grads_
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<Ema> ema_;
};

}  // namespace sana::train
