#include "sana/train/checkpoint/run_state.h"

namespace sana::train {

void RunState::advance(int64_t epoch, int64_t step, bool epoch_end, int64_t samples) {
  position_ = {epoch_end ? epoch + 1 : epoch, epoch_end ? 0 : step + 1, position_.global_step + 1,
               position_.consumed_samples + samples};
  if (epoch_end) segments_ = {{0, batch_}};
}

ckpt::TrainerState RunState::saved(ckpt::TrainerState identity) const {
  identity.position = position_;
  identity.global_batch_size = batch_.global_batch;
  identity.batch_tokens = batch_.batch_tokens;
  identity.epoch_segments.clear();
  if (position_.step_in_epoch > 0 && segments_.size() > 1) {
    for (const auto& g : segments_) {
      identity.epoch_segments.push_back({g.first_step, g.batch.global_batch, g.batch.batch_tokens});
    }
  }
  return identity;
}

bool RunState::continue_at(const ckpt::TrainerState& s) {
  resumed_ = true;
  position_ = s.position;
  if (position_.step_in_epoch > 0) {
    segments_ = {{0, {s.global_batch_size, s.batch_tokens}}};
    if (!s.epoch_segments.empty()) segments_.clear();
    for (const auto& g : s.epoch_segments) segments_.push_back({g.first_step, {g.global_batch_size, g.batch_tokens}});
  }
  return data::BatchSpec{s.global_batch_size, s.batch_tokens} != batch_;
}

void RunState::rebatch() {
  if (position_.step_in_epoch == 0) {
    segments_ = {{0, batch_}};
  } else {
    segments_.push_back({position_.step_in_epoch, batch_});
  }
}

}  // namespace sana::train
