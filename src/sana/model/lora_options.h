// What a LoRA run adapts and how (model/lora.h; train.lora in the YAML, filled by
// train/options/core_options.h). No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sana::model {

struct LoraOptions {
  int64_t rank = 4;
  double alpha = 0;  // 0: rank
  double dropout = 0;
  std::vector<std::string> targets = {"to_k", "to_q", "to_v"};  // diffusers' module names
  bool gaussian = true;  // A ~ normal(0, 1/rank); else PEFT's default (kaiming-uniform, a = sqrt(5))
  uint64_t seed = 0;     // the adapters' initial values are a pure function of it
  double scale() const { return (alpha > 0 ? alpha : static_cast<double>(rank)) / static_cast<double>(rank); }
};

}  // namespace sana::model
