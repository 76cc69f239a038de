// ControlNetBlocks (train/trainable.h): a ControlNet preset's control blocks on its frozen base.
#include <fmt/format.h>

#include <filesystem>

#include "sana/model/weights.h"
#include "sana/train/initial_model.h"
#include "sana/train/trainable.h"
#include "sana/util/log.h"

namespace sana::train {

ControlNetBlocks::ControlNetBlocks(model::SanaMS model) : Trainable(std::move(model)) {
  control_ = std::make_unique<model::ControlNetState>(*model_, tensors_checksum(model::base_parameters(*model_)));
  named_ = control_->parameters();
}

void ControlNetBlocks::check_base() const {
  check_frozen_base("ControlNet", "control blocks", control_->base_checksum(),
                    tensors_checksum(model::base_parameters(*model_)));
}

void ControlNetBlocks::write_final(const std::string& work_dir, std::map<std::string, std::string> metadata) const {
  metadata["base_checksum"] = control_->base_checksum();
  Trainable::write_final(work_dir, std::move(metadata));
}

std::map<std::string, std::string> ControlNetBlocks::file_metadata() const {
  return {{"base_checksum", control_->base_checksum()}};
}

std::string ControlNetBlocks::describe() const {
  return fmt::format("; ControlNet: the base (checksum {}) frozen, {} control blocks trained, {} trainable parameters",
                     control_->base_checksum(), model_->spec().control_blocks, control_->parameter_count());
}

}  // namespace sana::train
