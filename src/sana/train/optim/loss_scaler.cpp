#include "sana/train/optim/loss_scaler.h"

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

PartState LossScaler::save_state() const {
  if (!enabled_) return {};
  return {{{"loss_scale", state_.scale},
           {"loss_scale_clean_steps", state_.clean_in_a_row},
           {"overflow_steps", state_.overflows}},
          std::nullopt, {}};
}

void LossScaler::restore_state(const PartState* saved, const std::string& /*source*/) {
  if (!enabled_ || saved == nullptr || saved->json.value("loss_scale", 0.0) <= 0) return;
  const auto& j = saved->json;
  state_ = {j.at("loss_scale").get<double>(), j.value("loss_scale_clean_steps", int64_t{0}),
            j.value("overflow_steps", int64_t{0})};
}

}  // namespace sana::train
