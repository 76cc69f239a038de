#include "sana/train/elastic/continuation.h"

#include "sana/data/sample_cache.h"
#include "sana/util/log.h"

namespace sana::train {

void Continuation::mirror_shares(std::unique_ptr<ShareMirror> mirror, const Optimizer& optimizer, const Ema& ema) {
  mirror_ = std::move(mirror);
  mirror_->seed(optimizer, ema);  // collective: each share to the rank that mirrors it
  const int64_t bytes = mirror_->bytes();
  log::info("this rank mirrors rank {}'s share ({} rank{} before it) of the sharded state (dist.elastic "
            "continue): {} bytes ({})",
            mirror_->partner(), mirror_->stride(), mirror_->stride() == 1 ? "" : "s", bytes,
            data::size_text(static_cast<uint64_t>(bytes)));
}

void Continuation::before_commit() {
  if (mirror_) mirror_->take_gradients();
}

void Continuation::overflowed(int64_t step) {
  if (mirror_) mirror_->update_ema_at(step);
}

void Continuation::applied(int64_t step, double lr, double grad_norm, double loss_scale, double clip) {
  if (mirror_) mirror_->apply_step(step, lr, grad_norm, loss_scale, clip);
}

void Continuation::lost_in_update(const dist::RankLost& lost) {
  if (!mirror_) throw;  // the loss being handled
  lost_after_commit_ = lost.what();  // committed: every share has the step (a lost one's mirror too)
}

void Continuation::raise_lost() const {
  if (lost_after_commit_) throw dist::RankLost(*lost_after_commit_);
}

bool Continuation::take_in_replacements(bool stop_requested) {
  taking_in_ = !rt_.joining().empty() && !stop_requested;
  return taking_in_;
}

}  // namespace sana::train
