// What a run trains ("a frozen base plus trainable parts", docs/finetune.md): every parameter of
// the model, or under train.lora low-rank adapters on the model as a frozen base
// (model/lora.h, lora_trainable.cpp), or a ControlNet preset's control blocks on its frozen
// base (model/controlnet.h, controlnet_trainable.cpp). The reducer, the optimizer, the EMA, ZeRO's ownership and the checkpoints
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

#include "sana/distributed/runtime.h"
#include "sana/model/controlnet.h"
#include "sana/model/frozen_storage.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/stateful.h"

namespace sana::train {

using NamedTensorList = std::vector<std::pair<std::string, torch::Tensor>>;

// What a run trains, as the reducer, the optimizer, the EMA, ZeRO and the checkpoints see
// it. One implementation per kind: the whole model (WholeModel), adapters on a frozen base
// (LoraAdapters), a ControlNet's control blocks on its frozen base (ControlNetBlocks); a new
// kind (a distillation student beside its teacher) is one more, the others untouched.
class Trainable {
 public:
  virtual ~Trainable() = default;
  Trainable(const Trainable&) = delete;
  Trainable& operator=(const Trainable&) = delete;

  // The tensors that train, in a fixed order (the same on every rank).
  const NamedTensorList& parameters() const { return named_; }
  // Its part of checkpoints: the model (model.safetensors), or the adapters with the base's
  // checksum (lora.safetensors, a file diffusers loads), or the control blocks with it
  // (controlnet.safetensors).
  virtual Stateful& checkpoint_part() = 0;
  // Every trained tensor's checksum: the model's, with the adapters' under train.lora.
  virtual std::string checksum() const;
  // A frozen base: throws std::logic_error when it changed; logs that it did not. Nothing
  // when everything trains.
  virtual void check_base() const {}
  // On the writing rank at the end: work_dir/model.safetensors (a ControlNet's whole, as
  // upstream releases one), or under train.lora work_dir/pytorch_lora_weights.safetensors in diffusers'
  // naming. `metadata` is added to the file's.
  virtual void write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const;
  // The metadata an EMA file of parameters() carries (diffusers' LoRA settings under
  // train.lora, the base's checksum).
  virtual std::map<std::string, std::string> file_metadata() const { return {}; }
  // The model's parameters and whatever else trains beside them (memory.json's "parameters").
  virtual std::vector<torch::Tensor> all_tensors() const { return model_->parameters(); }
  // The start line's part: "" for the whole model.
  virtual std::string describe() const { return ""; }

 protected:
  explicit Trainable(model::SanaMS model) : model_(std::move(model)) {}
  model::SanaMS model_;
  NamedTensorList named_;
};

// Every parameter of the model trains.
class WholeModel : public Trainable {
 public:
  explicit WholeModel(model::SanaMS model);
  Stateful& checkpoint_part() override { return weights_; }

 private:
  model::ModuleState weights_;
};

// Low-rank adapters (model/lora.h) on the model as a frozen base, the same on every rank (a
// collective: their checksum is agreed).
class LoraAdapters : public Trainable {
 public:
  LoraAdapters(const model::LoraOptions& options, model::SanaMS model, dist::Runtime& rt);
  Stateful& checkpoint_part() override { return *lora_; }
  std::string checksum() const override;
  void check_base() const override;
  void write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const override;
  std::map<std::string, std::string> file_metadata() const override { return lora_->file_metadata(); }
  std::vector<torch::Tensor> all_tensors() const override;
  std::string describe() const override;

 private:
  std::string base_checksum_now() const;
  model::StorageDtype frozen_dtype_;  // what the base's layers are stored in (train.frozen_base_dtype)
  std::unique_ptr<model::Lora> lora_;
};

// A ControlNet preset's control blocks (model/controlnet.h) on its frozen base.
class ControlNetBlocks : public Trainable {
 public:
  explicit ControlNetBlocks(model::SanaMS model);
  Stateful& checkpoint_part() override { return *control_; }
  void check_base() const override;
  void write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const override;
  std::map<std::string, std::string> file_metadata() const override;
  std::string describe() const override;

 private:
  std::string base_checksum_now() const;
  model::StorageDtype frozen_dtype_;  // what the base's layers are stored in (train.frozen_base_dtype)
  std::unique_ptr<model::ControlNetState> control_;
};

// The kind the model and options ask for: a ControlNet preset's control blocks, else with
// `lora` (train.lora, torch_options.h's lora_for) adapters, else the whole model.
std::unique_ptr<Trainable> make_trainable(const std::optional<model::LoraOptions>& lora, model::SanaMS model,
                                          dist::Runtime& rt);

// A frozen base against its checksum at the start (`what` names the kind in the messages,
// `trained` what trains instead): throws std::logic_error when it changed, logs that it did not.
void check_frozen_base(const std::string& what, const std::string& trained, const std::string& at_start,
                       const std::string& now);

// FLOPs of one training sample: the forward, the backward's input gradients through it, and
// the weight gradients of what trains. A whole model: 3 x forward. A frozen base adds no
// weight gradients: under train.lora 2 x forward (the adapters' few FLOPs left out), a
// ControlNet 2 x forward plus its control blocks' forward once more. `lora`: train.lora is on.
double train_flops(bool lora, const model::ModelSpec& spec, const model::Flops& forward);

}  // namespace sana::train
