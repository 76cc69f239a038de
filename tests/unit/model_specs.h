// Small SanaMS shapes for tests: every module present, cheap enough for float64.
#pragma once

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

}  // namespace sana::test
