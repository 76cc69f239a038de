#include "sana/train/trainable/trainable.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "sana/train/trainable/initial_model.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

std::string Trainable::checksum() const { return weights_checksum(*model_); }

void Trainable::write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const {
  const auto path = (std::filesystem::path(work_dir) / "model.safetensors").string();
  model::save_weights(*model_, path, metadata);
  log::info("weights: {}", path);
}

WholeModel::WholeModel(model::SanaMS model) : Trainable(std::move(model)), weights_(*model_, "model") {
  for (const auto& p : model_->named_parameters()) named_.emplace_back(p.key(), p.value());
}

std::unique_ptr<Trainable> make_trainable(const std::optional<model::LoraOptions>& lora, model::SanaMS model,
                                          dist::Runtime& rt) {
  if (model->spec().control_blocks > 0) return std::make_unique<ControlNetBlocks>(std::move(model));
  if (lora) return std::make_unique<LoraAdapters>(*lora, std::move(model), rt);
  return std::make_unique<WholeModel>(std::move(model));
}

void check_frozen_base(const std::string& what, const std::string& trained, const std::string& at_start,
                       const std::string& now) {
  if (now != at_start) {
    throw std::logic_error(
        fmt::format("{}: the frozen base changed during training (checksum {} -> {})", what, at_start, now));
  }
  log::info("{}: the base weights are unchanged (checksum {}); only the {} trained", what, now, trained);
}

double train_flops(bool lora, const model::ModelSpec& spec, const model::Flops& forward) {
  if (spec.control_blocks > 0) return 2 * forward.total + static_cast<double>(spec.control_blocks) * forward.per_block;
  return (lora ? 2 : 3) * forward.total;
}

}  // namespace sana::train
