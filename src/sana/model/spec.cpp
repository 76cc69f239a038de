#include "sana/model/spec.h"

#include <fmt/format.h>

#include <algorithm>

namespace sana::model {

const char* conditioning_name(Conditioning c) {
  switch (c) {
    case Conditioning::caption: return "caption";
    case Conditioning::class_label: return "class";
    case Conditioning::none: return "none";
  }
  return "?";
}

int64_t ModelSpec::cond_tokens() const {
  switch (conditioning) {
    case Conditioning::caption: return caption_tokens;
    case Conditioning::class_label: return 1;
    case Conditioning::none: return 0;
  }
  return 0;
}

const std::vector<Preset>& presets() {
  // Upstream's registry (diffusion/model/nets/sana_multi_scale.py) for the first five;
  // the rest are ours, small enough for CPUs and for timing checkpoints.
  static const std::vector<Preset> all = {
      {"SanaMS_600M_P1_D28", 1152, 28, 16, 1, false, "about 0.6 B (Sana-0.6B: 590 M)", 0},
      {"SanaMS_1600M_P1_D20", 2240, 20, 20, 1, false, "1648.48 M (a comment in upstream's registry, also pasted on the P2 preset)", 0},
      // SANA-1.5's deeper models at the 1.6B width (model growth starts them from the D20).
      {"SanaMS_2400M_P1_D30", 2240, 30, 20, 1, false, "SANA-1.5", 0},
      {"SanaMS_3200M_P1_D40", 2240, 40, 20, 1, false, "SANA-1.5", 0},
      {"SanaMS_4800M_P1_D60", 2240, 60, 20, 1, false, "SANA-1.5 (\"60 layers, 4800M\" in upstream's registry)", 0},
      {"SanaMS_100M_P2_D12", 768, 12, 12, 2, true, "", 0},
      {"SanaMS_small_P2_D8", 256, 8, 8, 2, true, "", 0},
      {"SanaMS_tiny_P1_D4", 128, 4, 4, 1, true, "upstream's 32 px latent grid at CPU size", 0},
      {"SanaMS_tiny_P2_D4", 128, 4, 4, 2, true, "", 0},
      {"SanaMS_tiny_P4_D4", 128, 4, 4, 4, true, "", 0},
      // Upstream's ControlNet (sana_multi_scale_controlnet.py): the base plus copies of its
      // first 7 blocks; and a CPU-sized one with 2.
      {"SanaMSControlNet_600M_P1_D28", 1152, 28, 16, 1, false, "the 600M base and 7 ControlNet blocks", 7},
      {"SanaMSControlNet_1600M_P1_D20", 2240, 20, 20, 1, false, "the 1.6B base and 7 ControlNet blocks", 7},
      {"SanaMSControlNet_tiny_P2_D4", 128, 4, 4, 2, true, "", 2},
      // SANA-Sprint's students (upstream's SanaMSCM_*: SanaMS's parameters, the TrigFlow
      // forward); and a CPU-sized one.
      {"SanaMSCM_600M_P1_D28", 1152, 28, 16, 1, false, "SANA-Sprint 0.6B", 0, true},
      {"SanaMSCM_1600M_P1_D20", 2240, 20, 20, 1, false, "SANA-Sprint 1.6B", 0, true},
      {"SanaMSCM_2400M_P1_D30", 2240, 30, 20, 1, false, "", 0, true},
      {"SanaMSCM_tiny_P2_D4", 128, 4, 4, 2, true, "", 0, true},
  };
  return all;
}

ModelSpec preset_spec(const std::string& name) {
  const auto& all = presets();
  const auto it = std::find_if(all.begin(), all.end(), [&](const Preset& p) { return p.name == name; });
  if (it == all.end()) throw SpecError("model.model", fmt::format("unknown preset '{}'", name));
  ModelSpec s;
  s.name = it->name;
  s.hidden = it->hidden;
  s.depth = it->depth;
  s.cross_heads = it->cross_heads;
  s.patch = it->patch;
  s.control_blocks = it->control_blocks;
  s.trigflow = it->trigflow;
  return s;
}

void check_spec(const ModelSpec& s) {
  if (s.hidden % s.linear_head_dim != 0) {
    throw SpecError("model.linear_head_dim", fmt::format(
        "{} does not divide the width {} of {}; use a divisor such as 32",
        s.linear_head_dim, s.hidden, s.name));
  }
  if (s.control_blocks < 0 || s.control_blocks >= s.depth) {
    throw SpecError("model.model", fmt::format("{} ControlNet blocks need a deeper model than {} blocks ({})",
                                               s.control_blocks, s.depth, s.name));
  }
  if (s.mlp_hidden() < 1) {
    throw SpecError("model.mlp_ratio", fmt::format("{} gives no feed-forward channels", s.mlp_ratio));
  }
}

Flops forward_flops(const ModelSpec& s, int64_t height_px, int64_t width_px) {
  const int64_t cell = s.downsample * s.patch;
  Flops f;
  f.tokens = (height_px / cell) * (width_px / cell);
  const double n = static_cast<double>(f.tokens);
  const double c = static_cast<double>(s.hidden);
  const double l = static_cast<double>(s.cond_tokens());
  const double h = static_cast<double>(s.mlp_hidden());
  const double d = static_cast<double>(s.linear_head_dim);
  const double pp = static_cast<double>(s.patch * s.patch);
  // Per block: qkv, linear attention (v_pad k^T then (.) q, d+1 rows per head), proj,
  // cross-attention (q, kv over the tokens, scores, weights x v, proj), GLUMBConv.
  double block = 2 * n * c * 3 * c + 4 * n * c * (d + 1) + 2 * n * c * c;
  if (s.conditioning != Conditioning::none) {
    block += 2 * n * c * c + 2 * l * c * 2 * c + 2 * 2 * n * l * c + 2 * n * c * c;
  }
  block += 2 * n * c * 2 * h + 2 * n * 2 * h * 9 + 2 * n * h * c;
  f.per_block = block;
  double total = block * static_cast<double>(s.depth);
  total += 2 * n * (static_cast<double>(s.in_channels) * pp) * c;  // patch embedding
  if (s.control_blocks > 0) {  // the copied blocks, the control latent's embedding, before/after_proj
    total += block * static_cast<double>(s.control_blocks) + 2 * n * (static_cast<double>(s.in_channels) * pp) * c +
             2 * n * c * c * static_cast<double>(s.control_blocks + 1);
  }
  total += 2 * (256 * c + c * c) + 2 * c * 6 * c;                  // t_embedder, t_block
  if (s.cfg_embed) total += 2 * (256 * c + c * c);                // cfg_embedder (SANA-Sprint)
  if (s.logvar) total += 2 * c;                                    // logvar_linear
  if (s.conditioning == Conditioning::caption) {
    total += 2 * l * (static_cast<double>(s.caption_channels) * c + c * c);  // y_proj
  }
  total += 2 * n * c * (pp * static_cast<double>(s.out_channels));  // final layer
  f.total = total;
  return f;
}

}  // namespace sana::model
