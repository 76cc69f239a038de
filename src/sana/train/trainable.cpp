#include "sana/train/trainable.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
    control_ = std::make_unique<model::ControlNetState>(*model_, tensors_checksum(model::base_parameters(*model_)));
    named_ = control_->parameters();
    return;
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
  if (control_) return *control_;
  return *weights_;
}

std::string Trainable::checksum() const {
  if (!lora_) return weights_checksum(*model_);
  return Hasher().update(weights_checksum(*model_)).update(tensors_checksum(lora_->parameters())).hex();
}

std::string Trainable::base_checksum_now() const {
  if (lora_) return weights_checksum(*model_);
  if (control_) return tensors_checksum(model::base_parameters(*model_));
  return "";
}

std::string Trainable::frozen_base_checksum() const {
  if (lora_) return lora_->base_checksum();
  if (control_) return control_->base_checksum();
  return "";
}

void Trainable::check_base() const {
  if (!lora_ && !control_) return;
  const auto base = base_checksum_now();
  const std::string what = lora_ ? "train.lora" : "ControlNet";
  if (base != frozen_base_checksum()) {
    throw std::logic_error(fmt::format("{}: the frozen base changed during training (checksum {} -> {})", what,
                                       frozen_base_checksum(), base));
  }
  log::info("{}: the base weights are unchanged (checksum {}); only the {} trained", what, base,
            lora_ ? "adapters" : "control blocks");
}

void Trainable::write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const {
  if (!lora_) {
    const auto path = (std::filesystem::path(work_dir) / "model.safetensors").string();
    if (control_) metadata["base_checksum"] = control_->base_checksum();
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
  if (lora_) return lora_->file_metadata();
  if (control_) return {{"base_checksum", control_->base_checksum()}};
  return {};
}

std::vector<torch::Tensor> Trainable::all_tensors() const {
  auto out = model_->parameters();
  if (lora_) {
    for (const auto& [name, t] : lora_->parameters()) out.push_back(t);
  }
  return out;
}

std::string Trainable::describe() const {
  if (control_) {
    return fmt::format("; ControlNet: the base (checksum {}) frozen, {} control blocks trained, {} trainable parameters",
                       control_->base_checksum(), model_->spec().control_blocks, control_->parameter_count());
  }
  if (!lora_) return "";
  const auto& o = lora_->options();
  return fmt::format("; train.lora: the base (checksum {}) frozen, rank {} (scale {:g}) adapters on {} modules ({}), "
                     "{} trainable parameters",
                     lora_->base_checksum(), o.rank, o.scale(), lora_->parameters().size() / 2,
                     fmt::join(o.targets, ", "), lora_->parameter_count());
}

double train_flops(const config::Config& cfg, const model::ModelSpec& spec, const model::Flops& forward) {
  if (spec.control_blocks > 0) return 2 * forward.total + static_cast<double>(spec.control_blocks) * forward.per_block;
  return (config::lora_enabled(cfg.train) ? 2 : 3) * forward.total;
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
    if (spec.control_blocks > 0) {
      issues.fail("train.lora.rank", fmt::format("{} is a ControlNet: its base is frozen and its control blocks train "
                                                 "whole, without adapters; set train.lora.rank to 0",
                                                 spec.name));
      return;
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
