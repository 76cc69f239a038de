#include "sana/train/loop/update.h"

#include <cmath>
#include <string>
#include <unordered_map>
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

EvalWeights::EvalWeights(Update& update) : update_(update) {
  if (!update_.optimizer->has_eval_weights()) return;
  torch::NoGradGuard no_grad;
  const auto x = update_.optimizer->eval_weights();
  std::unordered_map<std::string, torch::Tensor> own(update_.zero->owned().begin(), update_.zero->owned().end());
  for (const auto& [name, value] : x) {
    auto& p = own.at(name);
    kept_.emplace_back(p, p.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    p.detach().copy_(value);
  }
  if (const auto share = update_.zero->after_update()) share();  // stages 1 and 2: to every rank
}

void EvalWeights::put_back() {
  torch::NoGradGuard no_grad;
  for (auto& [p, y] : kept_) p.detach().copy_(y);
  kept_.clear();
}

void EvalWeights::restore() {
  if (!update_.optimizer->has_eval_weights()) return;
  put_back();
  if (const auto share = update_.zero->after_update()) share();
}

EvalWeights::~EvalWeights() { put_back(); }

}  // namespace sana::train
