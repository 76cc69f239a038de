#include "sana/train/loss_scaler.h"

namespace sana::train {

bool LossScaler::update(bool finite_gradients) {
  if (!enabled_) return finite_gradients;
  if (!finite_gradients) {
    state_.scale *= kBackoff;
    state_.clean_in_a_row = 0;
    ++state_.overflows;
    return false;
  }
  if (++state_.clean_in_a_row == kGrowthInterval) {
    state_.scale *= kGrowth;
    state_.clean_in_a_row = 0;
  }
  return true;
}

}  // namespace sana::train
