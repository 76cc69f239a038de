#include "sana/train/loop/update.h"

#include <cmath>
#include <string>
#include <utility>

#include "sana/train/step/train_step.h"
#include "sana/util/log.h"

namespace sana::train {

std::unique_ptr<parallel::ShardedCheckpoints> Update::checkpoint_roles(dist::Runtime& rt, double timeout_s) const {
  parallel::ShardRoles roles{[z = &*zero](const std::string& e) { return z->owner_of(e); },
                             [z = &*zero](const std::string& e) { return z->order_of(e); }};
  return std::make_unique<parallel::ShardedCheckpoints>(rt, std::move(roles), timeout_s);
}

bool Update::apply(const StepVerdict& verdict, int64_t step, double grad_norm, double lr, double scale, double clip,
                   const std::optional<OwnTarget>& own, Continuation& elastic) {
  // fp16: gradients that overflow with a finite loss are the scaler's (skip, halve the scale),
  // not a non-finite step; torch's GradScaler does the same.
  const bool overflow = scaler->enabled() && verdict.nonfinite && std::isfinite(verdict.loss_mean);
  scaler->update(!verdict.nonfinite);
  if (overflow) {
    log::debug("step {}: gradients overflowed at loss scale {}: skipped, the scale is now {}", step, scale,
               scaler->scale());
  }
  const bool accepted = !overflow && nonfinite->accept(verdict.nonfinite, step);
  // Upstream updates the EMA on every synced step, the ones its GradScaler then skips
  // included: the average moves toward the unchanged (finite) weights.
  if (overflow) ema->update_at(step);
  if (overflow) elastic.overflowed(step);
  if (accepted && own) {  // the kind's own target: its optimizer, no EMA
    unscale_and_clip(own->reducer.flat_gradients(), grad_norm, scale, clip);
    own->optimizer.step(lr);
  } else if (accepted) {
    unscale_and_clip(reducer->flat_gradients(), grad_norm, scale, clip);
    ema->update_at(step);  // as upstream: before the step (the average lags by one)
    elastic.applied(step, lr, grad_norm, scale, clip);
    try {
      optimizer->step(lr);  // with what follows it (Optimizer::after_step: ZeRO's share of the update)
    } catch (const dist::RankLost& e) {
      elastic.lost_in_update(e);
    }
  }
  reducer->zero_gradients();  // a skipped step zeroes the kind's own too (the Trainer's part)
  return accepted;
}

}  // namespace sana::train
