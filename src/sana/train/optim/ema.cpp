#include "sana/train/optim/ema.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "sana/ckpt/checkpoint.h"
#include "sana/util/log.h"

namespace sana::train {

Ema::Ema(std::vector<std::pair<std::string, torch::Tensor>> params, double rate, bool checkpointed,
         std::map<std::string, std::string> metadata, EmaPlacement placement)
    : params_(std::move(params)),
      rate_(rate),
      checkpointed_(checkpointed),
      metadata_(std::move(metadata)),
      placement_(placement) {
  if (placement_.interval < 1) throw std::invalid_argument("Ema: the update interval must be at least 1");
  if (rate_ > 0) reset();
}

void Ema::reset() {
  torch::NoGradGuard no_grad;
  average_.clear();
  for (const auto& p : params_) {
    const auto device = placement_.host ? torch::Device(torch::kCPU) : placement_.device.value_or(p.second.device());
    average_.push_back(p.second.detach().to(device, /*non_blocking=*/false, /*copy=*/true));
  }
}

void Ema::update_at(int64_t step) {
  if (step % placement_.interval == 0) move(std::pow(rate_, static_cast<double>(placement_.interval)));
}

void Ema::move(double rate) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < average_.size(); ++i) {
    const torch::Tensor p = params_[i].second.detach();
    average_[i].mul_(rate).add_(p.device() == average_[i].device() ? p : p.to(average_[i].device()), 1 - rate);
  }
}

NamedTensors Ema::named_averages() const {
  NamedTensors out;
  for (size_t i = 0; i < average_.size(); ++i) out.emplace_back(params_[i].first, average_[i].to(torch::kCPU).clone());
  return out;
}

void Ema::restore_state(const PartState* part, const std::string& source) {
  if (!enabled()) return;
  const NamedTensors& saved = PartState::tensors_of(part);
  if (saved.empty()) {
    log::warn_shared("resume_from {}: the checkpoint holds no EMA weights (ckpt.save_ema false, or that run kept no "
                     "EMA); the EMA restarts from the weights", source);
    reset();
    return;
  }
  const std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto it = by_name.find(params_[i].first);
    if (it == by_name.end() || it->second.sizes() != average_[i].sizes()) {
      throw ckpt::CheckpointError(
          fmt::format("resume_from {}: EMA '{}' is missing or has another shape", source, params_[i].first));
    }
    average_[i].copy_(it->second);
  }
}

PartState Ema::save_state() const {
  if (!checkpointed_) return {nullptr, NamedTensors{}, {}};
  return {nullptr, named_averages(), metadata_};
}

}  // namespace sana::train
