// What SANA-1.5's model growth is asked to do (model/growth.h does it); filled from the
// model_growth section by train/options/core_options.h. No torch.
#pragma once

#include <cstdint>
#include <string>

namespace sana::model {

enum class GrowthStrategy { cyclic, block_expand, progressive, interpolation, random, constant };

struct GrowthOptions {
  std::string source;  // model_growth.pretrained_ckpt_path (safetensors or torch.save'd); "" = none
  GrowthStrategy strategy = GrowthStrategy::constant;
  int64_t source_layers = 20;  // model_growth.source_num_layers
  int64_t target_layers = 30;  // model_growth.target_num_layers: must be the model's depth
  int64_t expand_ratio = 3;    // model_growth.init_params.*
  double noise_scale = 0.01;
  bool zero_gate = false;
  double scale_spec = 0.0;
  double scale_others = 0.02;
  uint64_t seed = 0;  // train.seed: the new blocks' random draws
};

}  // namespace sana::model
