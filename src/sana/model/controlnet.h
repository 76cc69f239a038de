// Training a ControlNet (docs/controlnet.md): its base is frozen, its control blocks
// (`controlnet.*`, upstream's names) train. This is that part's state: the trained tensors
// and the checksum of the base they were trained on, which a resume checks, and how a
// ControlNet starts from a base model's weights.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/stateful.h"

namespace sana::model {

// Whether a parameter name belongs to the control blocks (everything else is the base).
bool is_control_parameter(const std::string& name);
// The base's parameters (the frozen part of a ControlNet), in registration order.
std::vector<std::pair<std::string, torch::Tensor>> base_parameters(const SanaMSImpl& model);

// model.load_from into a ControlNet. A file with control blocks (upstream's released
// ControlNet, or a run of ours) loads as it is. A base model's file (no `controlnet.*`)
// loads into the base, and the control blocks start from the loaded blocks, as upstream's
// initialize_all_and_copy_from_base: that is no missing key.
LoadReport load_controlnet_weights(SanaMSImpl& model, const std::string& path, bool strict);

class ControlNetState : public Stateful {
 public:
  // Freezes the base (requires_grad off); `base_checksum` identifies it.
  ControlNetState(SanaMSImpl& model, std::string base_checksum);

  // The control blocks' parameters, in registration order: what the run trains.
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return params_; }
  const std::string& base_checksum() const { return base_checksum_; }
  int64_t parameter_count() const;

  // controlnet.safetensors in checkpoints: the control blocks, with the base's checksum.
  std::string state_name() const override { return "controlnet"; }
  PartState save_state() const override;
  PartState save_state_of(const std::function<bool(const std::string&)>& keep) const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  SanaMSImpl& model_;
  std::string base_checksum_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
};

}  // namespace sana::model
