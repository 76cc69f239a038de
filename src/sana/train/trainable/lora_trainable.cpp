// LoraAdapters (train/trainable/trainable.h): low-rank adapters on the model as a frozen base.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "sana/train/trainable/initial_model.h"
#include "sana/train/trainable/trainable.h"
#include "sana/util/hash.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace sana::train {

LoraAdapters::LoraAdapters(const model::LoraOptions& options, model::SanaMS model, dist::Runtime& rt)
    : Trainable(std::move(model)), frozen_dtype_(model::frozen_storage_dtype(*model_)) {
  for (auto& p : model_->parameters()) p.requires_grad_(false);
  lora_ = std::make_unique<model::Lora>(*model_, options, base_checksum_now());
  named_ = lora_->parameters();
  rt.agree("LoRA adapters at start-up", checksum());
}

std::string LoraAdapters::checksum() const {
  return Hasher().update(weights_checksum(*model_)).update(tensors_checksum(lora_->parameters())).hex();
}

// The base's weights as stored, with the storage's dtype.
std::string LoraAdapters::base_checksum_now() const {
  return model::stored_base_checksum(frozen_dtype_, weights_checksum(*model_));
}

void LoraAdapters::check_base() const {
  check_frozen_base("train.lora", "adapters", lora_->base_checksum(), base_checksum_now());
}

void LoraAdapters::write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const {
  const auto path = (std::filesystem::path(work_dir) / model::kLoraWeightsFile).string();
  metadata.merge(lora_->file_metadata());
  metadata["base_checksum"] = lora_->base_checksum();
  write_safetensors(path, *lora_->save_state().tensors, metadata);
  log::info("LoRA adapters: {} (diffusers' naming: SanaPipeline.load_lora_weights takes it)", path);
}

std::vector<torch::Tensor> LoraAdapters::all_tensors() const {
  auto out = model_->parameters();
  for (const auto& [name, t] : lora_->parameters()) out.push_back(t);
  return out;
}

std::string LoraAdapters::describe() const {
  const auto& o = lora_->options();
  return fmt::format("; train.lora: the base (checksum {}) frozen, rank {} (scale {:g}) adapters on {} modules ({}), "
                     "{} trainable parameters",
                     lora_->base_checksum(), o.rank, o.scale(), lora_->parameters().size() / 2,
                     fmt::join(o.targets, ", "), lora_->parameter_count());
}

}  // namespace sana::train
