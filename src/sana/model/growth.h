// SANA-1.5's model growth: a deeper model whose blocks start from a shallower checkpoint's,
// by the rules of upstream's ModelGrowthInitializer (diffusion/model/model_growth_utils.py):
// every tensor outside the blocks is copied (upstream's pos_embed excepted); the first
// `source_layers` source blocks fill the new model by the strategy:
//   cyclic         block i = source block i mod S
//   block_expand   block i = source block i / expand_ratio (T = S x expand_ratio)
//   progressive    blocks < S copied; block i >= S = block i-1 + N(0, noise_scale^2)
//   interpolation  blocks < S copied; block i >= S = (1-a) source[lo] + a source[lo+1],
//                  lo = floor(i S / T), a = i S / T - lo (lo+1 capped at S-1)
//   random         blocks < S copied; the others keep the model's own initialisation
//   constant       blocks < S copied; in the others the output projections
//                  (attn.proj, cross_attn.proj, mlp.point_conv weights) ~ N(0, scale_spec^2),
//                  q/k norms 1, attention biases 0, depth_conv ~ N(0, 0.2^2), the rest
//                  ~ N(0, scale_others^2)
// With zero_gate (cyclic, block_expand) every repeat of a block after its first starts with
// its modulation table and output projections at zero. Random draws come from a CPU
// generator seeded with `seed`, in the model's tensor order (tests/reference/
// model_growth.py repeats them).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "sana/model/growth_options.h"
#include "sana/util/error.h"

namespace sana::model {

// A checkpoint or a model that does not fit the growth asked for: names the key.
class GrowthError : public sana::UsageError {
 public:
  explicit GrowthError(const std::string& what) : UsageError(what, "config error") {}
};

struct GrowthReport {
  int64_t source_blocks = 0;    // blocks in the checkpoint
  int64_t copied = 0;           // tensors copied from the checkpoint
  int64_t initialised = 0;      // tensors of new blocks set by the strategy
  std::string summary() const;  // one line for the log
};

// Sets `model`'s parameters and buffers (a SanaMS, any device and dtype) as the options say.
GrowthReport grow_model(torch::nn::Module& model, const GrowthOptions& options);

}  // namespace sana::model
