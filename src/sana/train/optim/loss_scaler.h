// Dynamic loss scaling for fp16 mixed precision, as torch's GradScaler (upstream trains fp16
// through accelerate's, with torch's defaults): the loss is multiplied by `scale` before the
// backward pass; a step whose gradients overflow is skipped and the scale halved; after
// `growth_interval` clean steps in a row the scale doubles. A stateful part ("loss_scaler"):
// its state goes into checkpoints. Off (scale 1, nothing skipped) unless the run autocasts
// to fp16.
#pragma once

#include <cstdint>
#include <string>

#include "sana/util/stateful.h"

namespace sana::train {

struct LossScalerState {
  double scale = 65536.0;      // torch's init_scale, 2^16
  int64_t clean_in_a_row = 0;  // GradScaler's growth tracker
  int64_t overflows = 0;       // steps skipped for overflow over the whole run
};

class LossScaler : public Stateful {
 public:
  static constexpr double kGrowth = 2.0, kBackoff = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

  explicit LossScaler(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }
  // What to multiply the loss by (1 when off).
  double scale() const { return enabled_ ? state_.scale : 1.0; }
  // After a step's gradients are known on every rank: true when they are finite (apply the
  // step, unscaled by 1 / scale()); false when they overflowed (skip it: the scale halves).
  bool update(bool finite_gradients);
  int64_t overflows() const { return state_.overflows; }

  std::string state_name() const override { return "loss_scaler"; }
  // Nothing when off; a resume into a run that scales takes a saved scale, if any.
  PartState save_state() const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  bool enabled_;
  LossScalerState state_;
};

}  // namespace sana::train
