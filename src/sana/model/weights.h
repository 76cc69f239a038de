// Model weights as files: safetensors with upstream's parameter names (parameters and
// buffers), and, for fine-tuning from Python, a torch.save'd state dict (a dict of name ->
// tensor, optionally under "state_dict", keys optionally prefixed "module."). Loading is
// strict by default and reports what did not fit: missing, unexpected and mismatched keys.
#pragma once

#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/util/error.h"
#include "sana/util/stateful.h"

namespace sana::model {

class WeightsError : public sana::UsageError {
 public:
  explicit WeightsError(const std::string& what) : UsageError(what, "weights error") {}
};

// The module's parameters, then its buffers, by name (views of the module's own tensors).
NamedTensors module_tensors(const torch::nn::Module& model);

void save_weights(const torch::nn::Module& model, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {});

struct LoadReport {
  std::vector<std::string> missing;     // in the model, not in the file
  std::vector<std::string> unexpected;  // in the file, not in the model
  std::vector<std::string> mismatched;  // "name: file 3x4, model 4x4"
  // In the file, kept by upstream's model but of no use to this one (pos_embed: upstream's
  // fixed sin-cos table; this model, like upstream with use_pe false, adds none): not
  // loaded, not a misfit, named once in the log.
  std::vector<std::string> ignored;
  // Not in the file and left as the model had it, for the run to make: the null caption
  // (y_embedder.y_embedding), which diffusers' layout does not keep, and a SANA-Sprint
  // student's logvar_linear, which diffusers' converter drops.
  std::vector<std::string> made_by_run;
  int64_t loaded = 0;
  bool clean() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string summary() const;  // a few names of each kind and the counts
};

// Copies matching tensors into `model` (any device / dtype). Strict: any missing,
// unexpected or mismatched key is a WeightsError carrying the report, and nothing is
// changed. Non-strict: what fits is loaded, the rest is reported.
LoadReport load_weights(torch::nn::Module& model, const std::string& path, bool strict = true);

// load_weights on tensors already in memory; `source` names them in messages.
LoadReport load_tensors(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& tensors,
                        const std::string& source, bool strict = true);

// A module's parameters and buffers as a stateful part (<name>.safetensors in checkpoints),
// restored strictly: a missing, unexpected or mis-shaped tensor is a WeightsError.
class ModuleState : public Stateful {
 public:
  ModuleState(torch::nn::Module& module, std::string name) : module_(module), name_(std::move(name)) {}
  std::string state_name() const override { return name_; }
  PartState save_state() const override;
  PartState save_state_of(const std::function<bool(const std::string&)>& keep) const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  torch::nn::Module& module_;
  std::string name_;
};

// Parts trained on a frozen base (LoRA adapters, a ControlNet's control blocks; their
// checkpoints record the base's checksum).
// A saved part restores only onto the base it trained on: a WeightsError naming both
// checksums unless `saved`'s JSON records `base_checksum`. `what`: "adapters", ...
void check_saved_base(const PartState& saved, const std::string& base_checksum, const std::string& what,
                      const std::string& source);
// Copies each of `params` from `by_name`, which must hold exactly them in the same shapes;
// else a WeightsError naming `source` and `what` that ends with `hint` (what to do).
void copy_exactly(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                  const std::map<std::string, torch::Tensor>& by_name, const std::string& source,
                  const std::string& what, const std::string& hint);

// name -> tensor from a .safetensors file or a torch.save'd state dict (.pt/.pth/.bin).
std::map<std::string, torch::Tensor> read_state_dict(const std::string& path);

}  // namespace sana::model
