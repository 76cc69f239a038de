// LoRA (train.lora, docs/finetune.md): low-rank adapters on a frozen base model, computed
// as PEFT's LoRA layers compute them and named as diffusers names them, so the adapters
// a run trains load into diffusers' SanaPipeline (load_lora_weights) as they are.
//  - A layer adapted gains B(A(dropout(x))) * alpha / rank: for a Linear, A [rank, in] and
//    B [out, rank]; for a Conv2d, A a convolution [rank, in, k, k] with the layer's stride and
//    padding, B a 1x1 convolution [out, rank, 1, 1]. B starts at zero: the adapted model's
//    output equals the base's exactly until the first step.
//  - Targets are diffusers' module names (diffusers_format.h's table), matched as PEFT
//    matches a list: the whole name or a dot-separated suffix. A fused upstream layer gets
//    one adapter per diffusers part (blocks.N.attn.qkv: to_q, to_k, to_v, each on its rows).
//  - Tensors are named "transformer.<diffusers module>.lora_A.weight" (and lora_B): the
//    names in diffusers' LoRA files, in checkpoints and to the reducer, optimizer and EMA.
//  - LoRA wraps the layers it adapts, as PEFT's LoRA layers wrap their base_layer: while the
//    Lora object lives, each adapted layer is a module of a type derived from the layer's
//    (model/sana_ms.h's LayerHost puts it in the layer's place) that returns the wrapped
//    layer's output plus its adapters'. It registers the base's weight and bias under their
//    own names and not the adapters, so the model's parameters and state dict stay the
//    base's, and the run's trainable parameters are the adapters' alone. The base layers
//    know nothing of it.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sana/model/lora_options.h"
#include "sana/model/sana_ms.h"
#include "sana/util/stateful.h"

namespace sana::model {

// Whether PEFT's rule for a list of target names selects the module `name`.
bool lora_targets(const std::string& name, const std::vector<std::string>& targets);

// The diffusers names of every layer of `model` an adapter can sit on (its Linears and its
// ungrouped convolutions), in the model's order.
std::vector<std::string> adaptable_modules(SanaMSImpl& model);

// The file a LoRA run leaves in its work_dir: diffusers' default name, the one
// load_lora_weights(folder) picks without a weight_name (before 2026-11-28: lora.safetensors,
// which export still reads).
inline constexpr const char* kLoraWeightsFile = "pytorch_lora_weights.safetensors";

class Lora : public Stateful {
 public:
  // Adds adapters to the layers `options.targets` select, on the layers' device (meta
  // included). Throws SpecError (key train.lora.target_modules) for a target that selects
  // nothing or a layer LoRA cannot adapt. `base_checksum` identifies the base in
  // checkpoints. The layers stay wrapped until this object goes.
  Lora(SanaMSImpl& model, const LoraOptions& options, std::string base_checksum);
  ~Lora() override;
  Lora(const Lora&) = delete;
  Lora& operator=(const Lora&) = delete;

  const LoraOptions& options() const { return options_; }
  // The trainable tensors by name, in the model's layer order (A before B).
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return params_; }
  int64_t parameter_count() const;
  const std::string& base_checksum() const { return base_checksum_; }
  // safetensors metadata diffusers reads back the adapters' settings from:
  // {"format": "pt", "lora_adapter_metadata": JSON of LoraConfig fields prefixed "transformer."}.
  std::map<std::string, std::string> file_metadata() const;
  // Adds every adapter's update to its layer's weight (W += B A * scale, per part).
  void merge_into_base() const;
  // Sets the adapters from tensors in their names (a file's, a checkpoint's); throws
  // WeightsError naming `source` when they do not fit (a missing, unexpected or mis-shaped one).
  void load(const std::map<std::string, torch::Tensor>& tensors, const std::string& source);

  // Checkpoints: "lora" (lora.safetensors, a file diffusers loads) with the base's checksum;
  // restoring onto another base is refused naming both checksums.
  std::string state_name() const override { return "lora"; }
  PartState save_state() const override;
  PartState save_state_of(const std::function<bool(const std::string&)>& keep) const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  struct Layer;
  SanaMSImpl& model_;
  LoraOptions options_;
  std::string base_checksum_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
};

// Adapters read from a file in diffusers' LoRA naming (what Lora saves): name -> tensor,
// and the rank and alpha its metadata gives (alpha = rank without metadata, as diffusers).
struct LoraFile {
  std::map<std::string, torch::Tensor> tensors;
  int64_t rank = 0;
  double alpha = 0;
  std::vector<std::string> targets;  // the diffusers modules it adapts, by their whole names
  std::string base_checksum;         // the base it was trained on ("" when the file does not say)
};
// A LoRA file in diffusers' naming; `ema_tensors` (may be empty): a file of the same
// adapters' EMA, whose values replace the file's.
LoraFile read_lora_file(const std::string& path, const std::string& ema_tensors = "");

// Folds the adapters of `file` into `model`'s weights. Throws WeightsError naming `source`
// when they do not fit the model or were trained on a base other than the one whose
// checksum is `base_checksum`.
void merge_lora_file(SanaMSImpl& model, const LoraFile& file, const std::string& base_checksum,
                     const std::string& source);

}  // namespace sana::model
