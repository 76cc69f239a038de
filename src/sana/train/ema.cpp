#include "sana/train/ema.h"

#include <fmt/format.h>

#include <map>

#include "sana/ckpt/checkpoint.h"
#include "sana/util/log.h"

namespace sana::train {

Ema::Ema(std::vector<std::pair<std::string, torch::Tensor>> params, double rate, bool checkpointed,
         std::map<std::string, std::string> metadata)
    : params_(std::move(params)), rate_(rate), checkpointed_(checkpointed), metadata_(std::move(metadata)) {
  if (rate_ > 0) reset();
}

void Ema::reset() {
  torch::NoGradGuard no_grad;
  average_.clear();
  for (const auto& p : params_) average_.push_back(p.second.detach().clone());
}

void Ema::update() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < average_.size(); ++i) average_[i].mul_(rate_).add_(params_[i].second.detach(), 1 - rate_);
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
