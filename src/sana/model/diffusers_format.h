// diffusers' layout of a Sana transformer (SanaTransformer2DModel: `transformer/config.json`
// and `diffusion_pytorch_model*.safetensors`, sharded with an index) and upstream's, which is
// ours. The names follow diffusers' published conversion rules: a rename everywhere except
// two row splits, no reshapes (docs/finetune.md lists them):
//   blocks.N.attn.qkv.weight [3C, C]       <-> transformer_blocks.N.attn1.to_q/to_k/to_v.weight
//   blocks.N.cross_attn.kv_linear.* [2C..] <-> transformer_blocks.N.attn2.to_k/to_v.*
// diffusers' transformer has no null caption (y_embedder.y_embedding: the run's encoder
// makes it, as for any run) and no position table (pos_embed: computed, or none).
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sana/model/spec.h"

namespace sana::model {

using TensorMap = std::map<std::string, torch::Tensor>;

// Whether a state dict is in diffusers' names (its blocks are transformer_blocks.N).
bool is_diffusers_layout(const TensorMap& tensors);
// Upstream's names to diffusers' (the null caption and pos_embed dropped). Throws
// WeightsError naming a tensor with no diffusers name (a class-label model's embedding).
TensorMap to_diffusers(const TensorMap& upstream);
// diffusers' names to upstream's; throws WeightsError naming a tensor it has no rule for or
// a to_q/to_k/to_v (to_k/to_v) group with a part missing.
TensorMap from_diffusers(const TensorMap& diffusers);

// diffusers' SanaControlNetModel (scripts/convert_sana_controlnet_to_diffusers.py) from a
// whole upstream ControlNet (the base and controlnet.*): the base's patch, caption and time
// embeddings and caption norm under the transformer's names, each copied block
// (controlnet.N.copied_block.*) as transformer_blocks.N.*, controlnet.0.before_proj as
// input_block and controlnet.N.after_proj as controlnet_blocks.N. Throws WeightsError naming
// a controlnet.* tensor it has no rule for.
TensorMap controlnet_to_diffusers(const TensorMap& upstream);

// The diffusers module(s) an upstream layer is ("blocks.3.attn.proj" -> {"transformer_blocks.3.
// attn1.to_out.0"}): a fused layer several, each rows [part * n / parts, (part + 1) * n /
// parts) of its output (blocks.N.attn.qkv: to_q, to_k, to_v). The names of LoRA adapters.
// guided: a SANA-Sprint student's (spec.cfg_embed), whose time embedding diffusers names as
// SanaCombinedTimestepGuidanceEmbeddings (time_embed.timestep_embedder, .guidance_embedder).
// None for the student's log-variance head, which diffusers' converter drops (so LoRA
// gives it no adapters).
struct DiffusersModule {
  std::string name;
  int64_t part = 0, parts = 1;
};
std::vector<DiffusersModule> diffusers_modules(const std::string& upstream_module, bool guided = false);

// diffusers' config.json for a model of `spec` trained at `image_size` pixels (its latent
// grid is sample_size; interpolation_scale as diffusers' converter sets it: none below
// 2048 px).
nlohmann::json diffusers_config(const ModelSpec& spec, int64_t image_size);
// SanaControlNetModel's config.json for a ControlNet of `spec`: its control blocks as
// num_layers, the base's other fields.
nlohmann::json diffusers_controlnet_config(const ModelSpec& spec, int64_t image_size);
// A field of a diffusers config.json that disagrees with a preset: its name, and "field:
// file X, preset Y".
struct ConfigMismatch {
  std::string field;
  std::string text;
  // What a fine-tune may change from the file's model (with model.load_strict: false):
  // SANA-Sprint's stage 1 adds q/k norms (they start at one) and normT's timestep scale, and
  // stage 2 starts a student, whose guidance embedding starts at zero, from a flow model.
  bool fine_tune_may_change() const;
};

// Each field of a diffusers config.json that disagrees with `spec` (layers, heads, head dims,
// cross-attention dims, caption channels, patch size, channels, q/k norm, timestep scale,
// guidance embedding).
std::vector<ConfigMismatch> config_mismatches(const nlohmann::json& config, const ModelSpec& spec);

// A diffusers transformer on disk: a folder with config.json and
// diffusion_pytorch_model.safetensors (or its shards and
// diffusion_pytorch_model.safetensors.index.json), or one such file. Tensors in diffusers'
// names; `config` null when the folder has none.
struct DiffusersFiles {
  TensorMap tensors;
  nlohmann::json config;
};
DiffusersFiles read_diffusers(const std::string& path);
// The config.json of the diffusers folder `path` is (or whose file it is); null when none.
nlohmann::json read_diffusers_config(const std::string& path);
// Whether `path` is a diffusers transformer folder (diffusion_pytorch_model.safetensors or
// its index inside), or a pipeline's folder with one in transformer/.
bool is_diffusers_folder(const std::string& path);

}  // namespace sana::model
