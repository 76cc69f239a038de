// train.lora's config check (declared in train/options/config_checks.h): it builds the config's
// model on the meta device, so it lives with the torch side, apart from config_checks.cpp.
#include <fmt/format.h>

#include "sana/config/checks.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/model/swapped_blocks.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/config_checks.h"

namespace sana::train {

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
  config::register_check("train.frozen_base_dtype", [](const config::Config& cfg, config::IssueSink& issues) {
    if (cfg.train.frozen_base_dtype == config::FrozenDtype::fp32 || config::lora_enabled(cfg.train)) return;
    try {
      if (model_spec_for(cfg).control_blocks > 0) return;  // a ControlNet's base is frozen
    } catch (const model::SpecError&) {
      return;  // the model's own check names it
    }
    issues.fail("train.frozen_base_dtype",
                fmt::format("is {}, which applies to a frozen base: under train.lora (rank > 0) the base is frozen, "
                            "and a ControlNet preset's (model.model SanaMSControlNet_*); here every weight trains. "
                            "Set it to fp32, train LoRA, or a ControlNet",
                            config::name_of(cfg.train.frozen_base_dtype)));
  });
  config::register_check("train.offload_blocks", [](const config::Config& cfg, config::IssueSink& issues) {
    if (cfg.train.offload_blocks == 0) return;
    model::ModelSpec spec;
    try {
      spec = model_spec_for(cfg);
    } catch (const model::SpecError&) {
      return;  // the model's own check names it
    }
    try {
      model::swapped_block_ids(cfg.train.offload_blocks, spec.depth);
    } catch (const model::SpecError& e) {
      issues.fail(e.key(), e.message());
      return;
    }
    if (config::lora_enabled(cfg.train) || spec.control_blocks > 0) return;  // a frozen base swaps
    // A full fine-tune: the trained blocks swap, their optimizer and master weights in host memory.
    if (!cfg.train.offload_optimizer) {
      issues.fail("train.offload_blocks",
                  fmt::format("is {:g} in a full fine-tune, where the swapped blocks train: their optimizer must be "
                              "in host memory too, where the updates are made. Set train.offload_optimizer: true, or "
                              "train.offload_blocks: 0",
                              cfg.train.offload_blocks));
    } else if (cfg.train.working_weights == config::WorkingWeights::on) {
      issues.fail("train.offload_blocks",
                  fmt::format("is {:g} in a full fine-tune with train.working_weights true, whose half copies of the "
                              "swapped blocks would stay on the device. Set train.working_weights: auto (off under "
                              "train.offload_optimizer), or train.offload_blocks: 0",
                              cfg.train.offload_blocks));
    } else if (cfg.train.zero_stage >= 3) {
      issues.fail("train.offload_blocks",
                  fmt::format("is {:g} with train.zero_stage 3, which keeps only this rank's share of each weight "
                              "and gathers the rest for each block; trained blocks swap under stages 0 to 2. Set "
                              "train.zero_stage: 2 (its gradients and optimizer state are sharded as well), or "
                              "train.offload_blocks: 0",
                              cfg.train.offload_blocks));
    }
  });
  config::register_check("train.frozen_base_double_quant", [](const config::Config& cfg, config::IssueSink& issues) {
    if (!cfg.train.frozen_base_double_quant || cfg.train.frozen_base_dtype == config::FrozenDtype::nf4) return;
    issues.fail("train.frozen_base_double_quant",
                fmt::format("is true, which quantises NF4's block scales; train.frozen_base_dtype is {}, which has "
                            "none. Set train.frozen_base_dtype: nf4, or leave train.frozen_base_double_quant out",
                            config::name_of(cfg.train.frozen_base_dtype)));
  });
}

}  // namespace sana::train
