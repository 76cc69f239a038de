// ControlNetBlocks (train/trainable/trainable.h): a ControlNet preset's control blocks on its frozen base.
#include <fmt/format.h>

#include <filesystem>

#include "sana/model/frozen_storage.h"
#include "sana/model/weights.h"
#include "sana/train/trainable/initial_model.h"
#include "sana/train/trainable/trainable.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace sana::train {

ControlNetBlocks::ControlNetBlocks(model::SanaMS model)
    : Trainable(std::move(model)), frozen_dtype_(model::frozen_storage_dtype(*model_)) {
  control_ = std::make_unique<model::ControlNetState>(*model_, base_checksum_now());
  named_ = control_->parameters();
}

// The base's tensors as stored (train.frozen_base_dtype), with the storage's dtype.
std::string ControlNetBlocks::base_checksum_now() const {
  return model::stored_base_checksum(frozen_dtype_, tensors_checksum(model::base_parameters(*model_)));
}

void ControlNetBlocks::check_base() const {
  check_frozen_base("ControlNet", "control blocks", control_->base_checksum(), base_checksum_now());
}

void ControlNetBlocks::write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const {
  metadata["base_checksum"] = control_->base_checksum();
  if (frozen_dtype_ == model::StorageDtype::fp32) {
    Trainable::write_final(work_dir, std::move(metadata));
    return;
  }
  // The whole model as upstream releases one, in fp32 under upstream's names: the base as
  // this run computed with it (bf16/fp16 values, or int8 / fp8 / NF4 codes restored).
  const auto path = (std::filesystem::path(work_dir) / "model.safetensors").string();
  write_safetensors(path, model::restored_tensors(*model_), metadata);
  log::info("weights: {} (the base as train.frozen_base_dtype {} kept it, in fp32{})", path,
            model::storage_dtype_name(frozen_dtype_),
            frozen_dtype_ == model::StorageDtype::bf16 || frozen_dtype_ == model::StorageDtype::fp16
                ? ""
                : ": its codes restored, not model.load_from's weights");
}

std::map<std::string, std::string> ControlNetBlocks::file_metadata() const {
  return {{"base_checksum", control_->base_checksum()}};
}

std::string ControlNetBlocks::describe() const {
  return fmt::format("; ControlNet: the base (checksum {}) frozen, {} control blocks trained, {} trainable parameters",
                     control_->base_checksum(), model_->spec().control_blocks, control_->parameter_count());
}

}  // namespace sana::train
