// After a step's backward: the step's agreement across the ranks (trainer.h's
// agree_on_step: one all-reduce, the step's one read from the device) and, when every rank
// accepts the step, the update of what it trains (unscale, clip, EMA, the optimizer, ZeRO's
// gather); and the stop signals the agreement carries.
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>

#include "sana/train/loop/trainer.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

void Trainer::watch_stop_signals() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

Trainer::Outcome Trainer::agree_and_update(StepOutput& out, double lr, double scale,
                                           const std::optional<OwnTarget>& own) {
  Outcome o;
  PhaseTimer timer(out.times, &StepTimes::optimizer);  // the agreement's all-reduce is left out
  auto& reducer = own ? own->reducer : *reducer_;
  const auto square_and_loss = grad_square_and_loss(reducer.flat_gradients(), out.loss_sum);
  const bool parts = reducer.gradients_sharded();  // ZeRO 2: each rank has its part of the norm
  timer.pause();
  elastic_.before_commit();  // the mirror's gradients (a collective at ZeRO 2 and 3)
  o.verdict = agree_on_step(square_and_loss, parts);
  timer.resume();
  o.grad_norm = std::sqrt(parts ? o.verdict.grad_square_sum : o.verdict.grad_square_whole) / scale;
  o.applied = update(o.verdict, o.grad_norm, lr, scale, own);
  return o;
}

bool Trainer::out_of_time() const {
  const double hours = cfg_.train.early_stop_hours;
  if (hours <= 0) return false;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 3600.0 > hours;
}

StepVerdict Trainer::agree_on_step(const torch::Tensor& square_and_loss, bool parts) {
  const auto [bad, reads] = guard_->local();
  // The host's figures; the loss and the norm follow on the device.
  const LocalStep mine{0.0, 0.0, bad, reads, g_stop_signal.load() != 0, out_of_time(), 0.0, 0.0};
  auto sums = torch::tensor(pack_step(mine, rt_.rank(), rt_.world_size()), torch::dtype(torch::kFloat64));
  // To a GPU through page-locked memory, without a wait: the read after the all-reduce is
  // the step's one wait for the device.
  if (rt_.device().is_cuda()) sums = sums.pin_memory().to(rt_.device(), /*non_blocking=*/true);
  {
    torch::NoGradGuard no_grad;
    const auto square = square_and_loss[0], loss = square_and_loss[1];
    const auto none = torch::zeros_like(square);
    const auto nonfinite = torch::logical_not(torch::isfinite(square).logical_and(torch::isfinite(loss)));
    static_assert(kLossSlot == kNonfiniteSlot + 1 && kSquareWholeSlot == kSquarePartSlot + 1, "two pairs of slots");
    sums.narrow(0, kNonfiniteSlot, 2).copy_(torch::stack({nonfinite.to(torch::kFloat64), loss}));
    sums.narrow(0, kSquarePartSlot, 2)
        .copy_(torch::stack({parts ? square : none, !parts && rt_.rank() == 0 ? square : none}));
  }
  rt_.all_reduce(sums);
  rt_.commit_step(run_.position().global_step + 1);  // dist.elastic continue: applied by all or none
  sums = sums.to(torch::kCPU).contiguous();
  auto verdict = decide_step({sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel()}, rt_.world_size());
  guard_->decide(verdict.total_bad, verdict.total_reads);
  return verdict;
}

bool Trainer::update(const StepVerdict& verdict, double grad_norm, double lr, double scale,
                     const std::optional<OwnTarget>& own) {
  // fp16: gradients that overflow with a finite loss are the scaler's (skip, halve the scale),
  // not a non-finite step; torch's GradScaler does the same.
  const bool overflow = scaler_->enabled() && verdict.nonfinite && std::isfinite(verdict.loss_mean);
  scaler_->update(!verdict.nonfinite);
  if (overflow) {
    log::debug("step {}: gradients overflowed at loss scale {}: skipped, the scale is now {}",
               run_.position().global_step + 1, scale, scaler_->scale());
  }
  const bool apply = !overflow && nonfinite_->accept(verdict.nonfinite, run_.position().global_step + 1);
  // Upstream updates the EMA on every synced step, the ones its GradScaler then skips
  // included: the average moves toward the unchanged (finite) weights.
  if (overflow) ema_->update_at(run_.position().global_step + 1);
  if (overflow) elastic_.overflowed(run_.position().global_step + 1);
  if (apply && own) {  // the kind's own target: its optimizer, no EMA
    unscale_and_clip(own->reducer.flat_gradients(), grad_norm, scale, cfg_.train.gradient_clip);
    own->optimizer.step(lr);
  } else if (apply) {
    unscale_and_clip(reducer_->flat_gradients(), grad_norm, scale, cfg_.train.gradient_clip);
    ema_->update_at(run_.position().global_step + 1);  // as upstream: before the step (the average lags by one)
    elastic_.applied(run_.position().global_step + 1, lr, grad_norm, scale, cfg_.train.gradient_clip);
    try {
      optimizer_->step(lr);  // with what follows it (Optimizer::after_step: ZeRO's share of the update)
    } catch (const dist::RankLost& e) {
      elastic_.lost_in_update(e);
    }
  }
  reducer_->zero_gradients();  // a skipped step zeroes the kind's own too
  kind_->zero_own_gradients();
  return apply;
}

}  // namespace sana::train
