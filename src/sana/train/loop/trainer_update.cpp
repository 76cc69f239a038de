// After a step's backward: the step's agreement across the ranks (trainer.h's
// agree_on_step: one all-reduce, the step's one read from the device) and, when every rank
// accepts the step, the update of what it trains (loop/update.h).
#include <cmath>

#include "sana/train/loop/trainer.h"
#include "sana/util/log.h"

namespace sana::train {

Trainer::Outcome Trainer::agree_and_update(StepOutput& out, double lr, double scale,
                                           const std::optional<OwnTarget>& own) {
  Outcome o;
  PhaseTimer timer(out.times, &StepTimes::optimizer);  // the agreement's all-reduce is left out
  auto& reducer = own ? own->reducer : *update_.reducer;
  const auto square_and_loss = grad_square_and_loss(reducer.flat_gradients(), out.loss_sum);
  const bool parts = reducer.gradients_sharded();  // ZeRO 2: each rank has its part of the norm
  timer.pause();
  elastic_.before_commit();  // the mirror's gradients (a collective at ZeRO 2 and 3)
  o.verdict = agree_on_step(square_and_loss, parts);
  timer.resume();
  o.grad_norm = std::sqrt(parts ? o.verdict.grad_square_sum : o.verdict.grad_square_whole) / scale;
  o.applied = update_.apply(o.verdict, run_.position().global_step + 1, o.grad_norm, lr, scale,
                            cfg_.train.gradient_clip, own, elastic_);
  kind_->zero_own_gradients();
  return o;
}

StepVerdict Trainer::agree_on_step(const torch::Tensor& square_and_loss, bool parts) {
  const auto [bad, reads] = input_.guard->local();
  // The host's figures; the loss and the norm follow on the device.
  const LocalStep mine{0.0, 0.0, bad, reads, stops_.signalled(), stops_.out_of_time(), 0.0, 0.0};
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
  input_.guard->decide(verdict.total_bad, verdict.total_reads);
  return verdict;
}

}  // namespace sana::train
