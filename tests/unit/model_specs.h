// Small SanaMS shapes for tests: every module present, cheap enough for float64.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "sana/model/sana_ms.h"
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

// SANA-Sprint's stage-2 student of upstream's YAMLs, small: q/k norms in both attentions,
// the guidance embedding (scale 0.1), the log-variance head and the timestep factor 1000.
inline model::ModelSpec sprint_student_spec(int64_t depth = 2) {
  auto spec = small_spec(model::Conditioning::caption);
  spec.qk_norm = spec.cross_norm = spec.cfg_embed = spec.logvar = true;
  spec.cfg_embed_scale = 0.1;
  spec.timestep_norm_scale = 1000.0;
  spec.depth = depth;
  return spec;
}

// max |a - b| / max |b|, in float64.
inline double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() /
          b.to(torch::kFloat64).abs().max().clamp_min(1e-300))
      .item<double>();
}

// A condition of `batch` random captions (the first with two padded tokens) or labels.
inline model::Condition condition_for(const model::ModelSpec& s, int64_t batch, torch::Dtype dtype = torch::kFloat32) {
  model::Condition c;
  if (s.conditioning == model::Conditioning::caption) {
    c.y = torch::randn({batch, s.caption_tokens, s.caption_channels}, dtype);
    c.mask = torch::ones({batch, s.caption_tokens}, torch::kInt64);
    if (s.caption_tokens > 2) c.mask.index_put_({0, torch::indexing::Slice(s.caption_tokens - 2)}, 0);
  } else if (s.conditioning == model::Conditioning::class_label) {
    c.y = torch::arange(batch, torch::kInt64) % s.num_classes;
  }
  return c;
}

// Every parameter and buffer nudged away from its initial value, so zero biases and unit
// norms cannot hide a wrong formula.
inline void perturb(model::SanaMS& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : model->parameters()) {
    p.add_(torch::empty(p.sizes(), p.options()).normal_(0, 0.05, gen));
  }
  for (auto& b : model->buffers()) b.add_(torch::empty(b.sizes(), b.options()).normal_(0, 0.05, gen));
}

// The spec as tests/reference/upstream_model.py reads it from a case file's metadata.
inline nlohmann::json reference_spec_json(const model::ModelSpec& s) {
  return {{"hidden", s.hidden}, {"depth", s.depth}, {"cross_heads", s.cross_heads}, {"patch", s.patch},
          {"out_channels", s.out_channels}, {"linear_head_dim", s.linear_head_dim},
          {"mlp_hidden", s.mlp_hidden()}, {"conditioning", model::conditioning_name(s.conditioning)},
          {"num_classes", s.num_classes}, {"norm_eps", s.norm_eps}, {"control_blocks", s.control_blocks},
          {"cfg_embed", s.cfg_embed}, {"cfg_embed_scale", s.cfg_embed_scale}, {"logvar", s.logvar},
          {"logvar_scale", s.logvar_scale}, {"timestep_norm_scale", s.timestep_norm_scale}};
}

}  // namespace sana::test
