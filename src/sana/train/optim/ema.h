// The exponential moving average of the weights (train.ema_update, train.ema_rate). Owns
// the averaged copies; the trainer calls update() after clipping and before each optimizer
// step (upstream's order: the average lags the weights by one step). A stateful part
// ("ema"): checkpoints hold save_state() (ema.safetensors) and a resume hands it back.
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sana/util/safetensors.h"
#include "sana/util/stateful.h"

namespace sana::train {

// Where the average lives and how often it moves (train.ema_device, ema_update_interval).
struct EmaPlacement {
  bool host = false;     // in host memory, whatever device the weights are on
  int64_t interval = 1;  // update_at() moves it on every interval-th step, by rate^interval
  // Where the average lives when not in host memory: the run's device, also for weights that
  // are in host memory between uses (a swapped block's, model/swapped_blocks.h); unset:
  // where each weight is.
  std::optional<torch::Device> device;
};

class Ema : public Stateful {
 public:
  // params: (name, parameter) in registration order; the average starts at their values.
  // `checkpointed` false (ckpt.save_ema false): checkpoints hold an empty ema.safetensors.
  // `metadata`: what its files carry besides (under train.lora diffusers' LoRA settings, so
  // that a checkpoint's EMA adapters load with the run's alpha).
  Ema(std::vector<std::pair<std::string, torch::Tensor>> params, double rate, bool checkpointed = true,
      std::map<std::string, std::string> metadata = {}, EmaPlacement placement = {});

  bool enabled() const { return !average_.empty(); }
  double rate() const { return rate_; }
  bool on_host() const { return placement_.host; }
  // average = rate * average + (1 - rate) * parameter, for every parameter.
  void update() { move(rate_); }
  // Before optimizer step `step` (counted from 1): on every interval-th step, the average
  // moves by rate^interval (with interval 1, update()).
  void update_at(int64_t step);

  // The averages by parameter name, on the CPU (empty when off): what checkpoints and the
  // run's final EMA file hold.
  NamedTensors named_averages() const;
  // Restarts the average from the current weights.
  void reset();

  const std::vector<torch::Tensor>& averages() const { return average_; }

  std::string state_name() const override { return "ema"; }
  PartState save_state() const override;
  // Takes the averages saved by save_state(). A part without tensors (a checkpoint written
  // with ckpt.save_ema false) restarts the average from the current weights with a warning;
  // a missing or mis-shaped entry throws ckpt::CheckpointError naming it and `source`.
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<torch::Tensor> average_;
  void move(double rate);
  double rate_;
  bool checkpointed_;
  std::map<std::string, std::string> metadata_;
  EmaPlacement placement_;
};

}  // namespace sana::train
