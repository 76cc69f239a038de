// Small SanaMS shapes for tests: every module present, cheap enough for float64.
#pragma once

#include <torch/torch.h>

#include "sana/model/spec.h"

namespace sana::test {

inline model::ModelSpec small_spec(model::Conditioning cond = model::Conditioning::caption, int64_t patch = 2) {
  model::ModelSpec s;
  s.name = "test";
  s.hidden = 64;
  s.depth = 2;
  s.cross_heads = 4;
  s.patch = patch;
  s.in_channels = s.out_channels = 3;
  s.downsample = 1;
  s.linear_head_dim = 16;
  s.mlp_ratio = 2.5;
  s.conditioning = cond;
  s.caption_channels = 24;
  s.caption_tokens = 6;
  s.num_classes = 5;
  return s;
}

// max |a - b| / max |b|, in float64.
inline double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() /
          b.to(torch::kFloat64).abs().max().clamp_min(1e-300))
      .item<double>();
}

}  // namespace sana::test
