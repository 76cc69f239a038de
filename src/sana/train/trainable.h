// What a run trains ("a frozen base plus trainable parts", docs/finetune.md): every parameter of
// the model, or under train.lora low-rank adapters on the model as a frozen base
// (model/lora.h), or a ControlNet preset's control blocks on its frozen base
// (model/controlnet.h). The reducer, the optimizer, the EMA, ZeRO's ownership and the checkpoints
// see parameters() alone; a frozen base is identified by its checksum, recorded in each
// checkpoint and checked again at the end of the run.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sana/config/config.h"
#include "sana/distributed/runtime.h"
#include "sana/model/controlnet.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/stateful.h"

namespace sana::train {

class Trainable {
 public:
  // Under train.lora the base is frozen and the adapters added, the same on every rank (a
  // collective: their checksum is agreed). A ControlNet's base is frozen.
  Trainable(const config::Config& cfg, model::SanaMS model, dist::Runtime& rt);
  Trainable(const Trainable&) = delete;
  Trainable& operator=(const Trainable&) = delete;

  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return named_; }
  // Its part of checkpoints: the model (model.safetensors), or the adapters with the base's
  // checksum (lora.safetensors, a file diffusers loads), or the control blocks with it
  // (controlnet.safetensors).
  Stateful& checkpoint_part();
  // Every trained tensor's checksum: the model's, with the adapters' under train.lora.
  std::string checksum() const;
  // A frozen base: throws std::logic_error when it changed; logs that it did not.
  void check_base() const;
  // On the writing rank at the end: work_dir/model.safetensors (a ControlNet's whole, as
  // upstream releases one), or under train.lora work_dir/lora.safetensors in diffusers'
  // naming. `metadata` is added to the file's.
  void write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const;
  // The metadata an EMA file of parameters() carries (diffusers' LoRA settings under
  // train.lora, the base's checksum).
  std::map<std::string, std::string> file_metadata() const;
  // The model's parameters and the adapters (memory.json's "parameters").
  std::vector<torch::Tensor> all_tensors() const;
  // The start line's part: "" for the whole model.
  std::string describe() const;

 private:
  model::SanaMS model_;
  // The frozen base's checksum now, and at the start ("" when all trains).
  std::string base_checksum_now() const;
  std::string frozen_base_checksum() const;

  std::unique_ptr<model::Lora> lora_;
  std::unique_ptr<model::ControlNetState> control_;
  std::optional<model::ModuleState> weights_;
  std::vector<std::pair<std::string, torch::Tensor>> named_;
};

// FLOPs of one training sample: the forward, the backward's input gradients through it, and
// the weight gradients of what trains. A whole model: 3 x forward. A frozen base adds no
// weight gradients: under train.lora 2 x forward (the adapters' few FLOPs left out), a
// ControlNet 2 x forward plus its control blocks' forward once more.
double train_flops(const config::Config& cfg, const model::ModelSpec& spec, const model::Flops& forward);

// Registers the config check of train.lora (config/checks.h): every target must select a
// layer LoRA can adapt in the config's model (built on the meta device), so a mistake exits
// 2 naming the key before anything starts. Call once at start-up, as register_checks().
void register_lora_check();

}  // namespace sana::train
