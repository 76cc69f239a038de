// The shape of a SanaMS linear DiT as plain numbers: presets by name (upstream's shapes
// plus small ones for CPUs), the spec a run's config resolves to, and the forward FLOPs
// of one sample at a bucket's size (train/options/core_options.h fills a spec from the
// run's config). Never includes torch, so `sana-train model` and the
// config checks can use it without building a model.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/util/error.h"

namespace sana::model {

// What the cross-attention attends to: caption features (text encoder output, [L, D]
// tokens with a mask), a class label (one learned token per class plus a null class),
// or nothing (no cross-attention at all).
enum class Conditioning { caption, class_label, none };
const char* conditioning_name(Conditioning c);

struct ModelSpec {
  std::string name;
  int64_t hidden = 1152;        // C
  int64_t depth = 28;           // blocks
  int64_t cross_heads = 16;     // softmax cross-attention heads
  int64_t patch = 1;            // patch size (kernel = stride)
  int64_t in_channels = 32;     // latent channels, or 3 in pixel space
  int64_t out_channels = 32;
  int64_t downsample = 32;      // pixels per input cell: the VAE's rate, 1 for pixels
  int64_t linear_head_dim = 32; // self-attention heads = hidden / linear_head_dim
  double mlp_ratio = 2.5;       // GLUMBConv hidden = int(hidden * mlp_ratio)
  Conditioning conditioning = Conditioning::caption;
  int64_t caption_channels = 2304;
  int64_t caption_tokens = 300;  // model_max_length
  int64_t num_classes = 0;       // class_label: the table has num_classes + 1 rows
  bool y_norm = true;            // RMSNorm on the conditioning tokens
  double y_norm_scale = 0.01;    // its initial weight
  double norm_eps = 1e-5;        // RMSNorm eps (y_norm and qk_norm)
  bool qk_norm = false;          // RMSNorm on self-attention q and k (SANA-1.5)
  bool cross_norm = false;       // RMSNorm (eps 1e-6) on cross-attention q and k (SANA-1.5)
  bool use_pe = false;           // fixed 2-D sin-cos position embedding on the patch tokens
  double pe_interpolation = 1.0; // its grid scale
  int64_t pe_base_size = 16;     // its reference grid: model.image_size / (downsample x patch)
  bool fp32_attention = true;    // linear attention in fp32 with autocast off (as upstream)
  bool integer_timesteps = true; // truncate timesteps to integers, as upstream's forward (timestep_grid)
  // scheduler.timestep_norm_scale_factor: the forward divides the timestep by it (in fp32, no
  // truncation: SANA-Sprint's teacher sees sigma, not 1000 sigma); 1 = off.
  double timestep_norm_scale = 1.0;
  // SANA-Sprint's student (upstream's cfg_embed / logvar): a second timestep embedder of the
  // guidance scale x cfg_embed_scale, added to the time embedding (cfg_embedder.*), and a
  // log-variance read from that embedding, Linear(hidden, 1) x logvar_scale (logvar_linear.*).
  bool cfg_embed = false;
  double cfg_embed_scale = 1.0;
  bool logvar = false;
  double logvar_scale = 1.0;
  double class_dropout_prob = 0.0;
  // ControlNet (upstream's SanaMSControlNet, copy_blocks_num): copies of the first blocks
  // fed a control latent, each one's output added to the next base block's input; 0 = none.
  int64_t control_blocks = 0;
  // A SanaMSCM preset: SANA-Sprint's TrigFlow student (upstream's SanaMSCM, the same
  // parameters as SanaMS; model/trigflow.h), trained by stage 2 (docs/sprint.md).
  bool trigflow = false;

  int64_t mlp_hidden() const { return static_cast<int64_t>(static_cast<double>(hidden) * mlp_ratio); }
  int64_t linear_heads() const { return hidden / linear_head_dim; }
  int64_t cond_tokens() const;  // tokens the cross-attention sees: L, 1 or 0
};

struct Preset {
  std::string name;
  int64_t hidden, depth, cross_heads, patch;
  bool cpu_sized;  // made for CPUs (pixel space works); not an upstream model
  std::string upstream_params;  // what upstream reports, "" for our own presets
  int64_t control_blocks;       // ControlNet presets: upstream's copy_blocks_num (7); 0 otherwise
  bool trigflow = false;        // SanaMSCM presets (ModelSpec::trigflow)
};
const std::vector<Preset>& presets();

// A config whose model cannot be built: names the key (e.g. "model.linear_head_dim").
class SpecError : public sana::UsageError {
 public:
  SpecError(std::string key, const std::string& message)
      : UsageError(key + ": " + message, "config error"), key_(std::move(key)), message_(message) {}
  const std::string& key() const { return key_; }
  const std::string& message() const { return message_; }

 private:
  std::string key_, message_;
};

// The named preset's shape (model.model) on a default spec; throws SpecError for an
// unknown name.
ModelSpec preset_spec(const std::string& name);
// Throws SpecError naming the key when the spec's combination cannot work.
void check_spec(const ModelSpec& spec);

// Multiply-adds x 2 of the matrix products and convolutions of one forward pass of one
// sample whose bucket is height x width pixels (elementwise work not counted).
struct Flops {
  double total = 0;
  double per_block = 0;
  int64_t tokens = 0;  // image tokens
};
Flops forward_flops(const ModelSpec& spec, int64_t height_px, int64_t width_px);

}  // namespace sana::model
