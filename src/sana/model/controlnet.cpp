// Upstream's ControlNet on SanaMS (sana_multi_scale_controlnet.py): the control blocks and
// their start; SanaMSImpl::forward runs them (sana_ms.cpp).
#include "sana/model/controlnet.h"

#include <fmt/format.h>

#include <algorithm>

#include "sana/util/log.h"

namespace sana::model {

ControlSanaMSBlockImpl::ControlSanaMSBlockImpl(const ModelSpec& spec, int64_t index_, const torch::TensorOptions& o)
    : index(index_) {
  copied_block = register_module("copied_block", SanaMSBlock(spec, o));
  if (index == 0) layer("before_proj", before_proj, Linear(spec.hidden, spec.hidden, true, o));
  layer("after_proj", after_proj, Linear(spec.hidden, spec.hidden, true, o));
}

void SanaMSImpl::copy_control_blocks() {
  if (!controlnet) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < controlnet->size(); ++i) {
    auto* cb = controlnet[i]->as<ControlSanaMSBlockImpl>();
    const auto base = blocks[i]->named_parameters();
    for (auto& p : cb->copied_block->named_parameters()) p.value().copy_(base[p.key()]);
    for (auto* proj : {cb->before_proj ? cb->before_proj.get() : nullptr, cb->after_proj.get()}) {
      if (proj == nullptr) continue;  // before_proj: the first block's alone
      proj->weight.zero_();
      proj->bias.zero_();
    }
  }
}

bool is_control_parameter(const std::string& name) { return name.rfind("controlnet.", 0) == 0; }

LoadReport load_controlnet_weights(SanaMSImpl& model, const std::string& path, bool strict) {
  auto report = load_weights(model, path, /*strict=*/false);
  const auto control = std::count_if(report.missing.begin(), report.missing.end(), is_control_parameter);
  int64_t control_params = 0;
  for (const auto& p : model.named_parameters()) control_params += is_control_parameter(p.key()) ? 1 : 0;
  if (control == control_params) {  // a base model's file: the control blocks start from it
    model.copy_control_blocks();
    report.missing.erase(std::remove_if(report.missing.begin(), report.missing.end(), is_control_parameter),
                         report.missing.end());
    log::info("model.load_from: {} holds a base model (no controlnet.* weights): the {} control blocks start as "
              "copies of its first {} blocks, their projections zero (upstream's initialize_all_and_copy_from_base)",
              path, model.spec().control_blocks, model.spec().control_blocks);
  }
  if (strict && !report.clean()) {
    throw WeightsError(fmt::format("'{}' does not fit the model: {} (load non-strictly to take what fits)", path,
                                   report.summary()));
  }
  return report;
}

ControlNetState::ControlNetState(SanaMSImpl& model, std::string base_checksum)
    : model_(model), base_checksum_(std::move(base_checksum)) {
  for (const auto& p : model.named_parameters()) {
    if (is_control_parameter(p.key())) {
      params_.emplace_back(p.key(), p.value());
    } else {
      p.value().requires_grad_(false);
    }
  }
}

std::vector<std::pair<std::string, torch::Tensor>> base_parameters(const SanaMSImpl& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters()) {
    if (!is_control_parameter(p.key())) out.emplace_back(p.key(), p.value());
  }
  return out;
}

int64_t ControlNetState::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, t] : params_) n += t.numel();
  return n;
}

PartState ControlNetState::save_state() const { return save_state_of([](const std::string&) { return true; }); }

PartState ControlNetState::save_state_of(const std::function<bool(const std::string&)>& keep) const {
  PartState s;
  NamedTensors tensors;
  for (const auto& [name, t] : params_) {
    if (keep(name)) tensors.emplace_back(name, t.detach().to(torch::kCPU).clone());
  }
  s.json = {{"base_checksum", base_checksum_}, {"control_blocks", model_.spec().control_blocks}};
  s.tensors = std::move(tensors);
  s.metadata["base_checksum"] = base_checksum_;
  return s;
}

void ControlNetState::restore_state(const PartState* saved, const std::string& source) {
  if (saved == nullptr || !saved->tensors) {
    throw WeightsError(fmt::format(
        "{} holds no control blocks (no controlnet.safetensors): a run that trained a whole model wrote it. To "
        "train a ControlNet on its weights, set model.load_from to its model.safetensors and start in a new "
        "work_dir (or resume_from: none)",
        source));
  }
  check_saved_base(*saved, base_checksum_, "control blocks", source);
  copy_exactly(params_, {saved->tensors->begin(), saved->tensors->end()}, source, "control blocks",
               fmt::format("resume with the model.model it trained ({} control blocks)", model_.spec().control_blocks));
}

}  // namespace sana::model
