#include "sana/train/trainable.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "sana/config/checks.h"
#include "sana/train/component_options.h"
#include "sana/train/initial_model.h"
#include "sana/util/error.h"
#include "sana/util/hash.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace sana::train {

Trainable::Trainable(const config::Config& cfg, model::SanaMS model, dist::Runtime& rt) : model_(std::move(model)) {
  if (model_->spec().control_blocks > 0) {
    throw UsageError(fmt::format("model.model: {} is a ControlNet; training one (the base frozen, the control blocks "
                                 "trained on control maps from the loader) is not built yet. `sana-train model` and "
                                 "model.load_from take it; train its base preset meanwhile",
                                 model_->spec().name),
                     "config error");
  }
  if (!config::lora_enabled(cfg.train)) {
    for (const auto& p : model_->named_parameters()) named_.emplace_back(p.key(), p.value());
    weights_.emplace(*model_, "model");
    return;
  }
  const auto base = weights_checksum(*model_);
  for (auto& p : model_->parameters()) p.requires_grad_(false);
  lora_ = std::make_unique<model::Lora>(*model_, lora_options_for(cfg), base);
  named_ = lora_->parameters();
  rt.agree("LoRA adapters at start-up", checksum());
}

Stateful& Trainable::checkpoint_part() {
  if (lora_) return *lora_;
  return *weights_;
}

std::string Trainable::checksum() const {
  if (!lora_) return weights_checksum(*model_);
  return Hasher().update(weights_checksum(*model_)).update(tensors_checksum(lora_->parameters())).hex();
}

void Trainable::check_base() const {
  if (!lora_) return;
  const auto base = weights_checksum(*model_);
  if (base != lora_->base_checksum()) {
    throw std::logic_error(fmt::format("train.lora: the frozen base changed during training (checksum {} -> {})",
                                       lora_->base_checksum(), base));
  }
  log::info("train.lora: the base weights are unchanged (checksum {}); only the adapters trained", base);
}

void Trainable::write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const {
  if (!lora_) {
    const auto path = (std::filesystem::path(work_dir) / "model.safetensors").string();
    model::save_weights(*model_, path, metadata);
    log::info("weights: {}", path);
    return;
  }
  const auto path = (std::filesystem::path(work_dir) / "lora.safetensors").string();
  metadata.merge(lora_->file_metadata());
  metadata["base_checksum"] = lora_->base_checksum();
  write_safetensors(path, *lora_->save_state().tensors, metadata);
  log::info("LoRA adapters: {} (diffusers' naming: SanaPipeline.load_lora_weights takes it)", path);
}

std::map<std::string, std::string> Trainable::file_metadata() const {
  return lora_ ? lora_->file_metadata() : std::map<std::string, std::string>{};
}

std::vector<torch::Tensor> Trainable::all_tensors() const {
  auto out = model_->parameters();
  if (lora_) {
    for (const auto& [name, t] : lora_->parameters()) out.push_back(t);
  }
  return out;
}

std::string Trainable::describe() const {
  if (!lora_) return "";
  const auto& o = lora_->options();
  return fmt::format("; train.lora: the base (checksum {}) frozen, rank {} (scale {:g}) adapters on {} modules ({}), "
                     "{} trainable parameters",
                     lora_->base_checksum(), o.rank, o.scale(), lora_->parameters().size() / 2,
                     fmt::join(o.targets, ", "), lora_->parameter_count());
}

void register_lora_check() {
  config::register_check("train.lora targets", [](const config::Config& cfg, config::IssueSink& issues) {
    if (!config::lora_enabled(cfg.train)) return;
    model::ModelSpec spec;
    try {
      spec = model_spec_for(cfg);
    } catch (const model::SpecError&) {
      return;  // the model's own check names it
    }
    model::SanaMS meta(spec, model::BuildOptions{torch::kFloat32, /*meta=*/true, 0});
    try {
      const model::Lora lora(*meta, lora_options_for(cfg), "");
    } catch (const model::SpecError& e) {
      issues.fail(e.key(), e.message());
    }
  });
}

}  // namespace sana::train
