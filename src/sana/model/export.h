// A model's weights in the two layouts Sana's tools load (docs/finetune.md):
//  - diffusers: a transformer folder (config.json as diffusers' SanaTransformer2DModel reads
//    it; diffusion_pytorch_model.safetensors, or shards of at most `max_shard_bytes` named
//    diffusion_pytorch_model-0000i-of-0000N.safetensors with
//    diffusion_pytorch_model.safetensors.index.json), as diffusers' save_pretrained writes;
//  - upstream: a .pth holding {"state_dict": {name: tensor}} (LibTorch's pickler, which
//    torch.load reads; upstream's own checkpoints add "state_dict_ema" and the optimizer).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sana/model/diffusers_format.h"
#include "sana/model/spec.h"

namespace sana::model {

// diffusers' default shard limit as its converter uses it: 5 GB (decimal).
constexpr int64_t kDiffusersShardBytes = 5'000'000'000;

// The files written, in order. `tensors` in upstream's names (fp32 as they are).
std::vector<std::string> export_diffusers(const TensorMap& tensors, const ModelSpec& spec, int64_t image_size,
                                          const std::string& dir, int64_t max_shard_bytes = kDiffusersShardBytes);
// A ControlNet (`tensors`: the base and controlnet.*, upstream's names) as the folders
// SanaControlNetPipeline takes: `dir`/transformer (the base, as export_diffusers writes it)
// and `dir`/controlnet (SanaControlNetModel: diffusers_format.h's controlnet_to_diffusers and
// its config.json). Throws WeightsError for a model SanaControlNetModel cannot hold (no
// caption norm, q/k norms).
std::vector<std::string> export_controlnet_diffusers(const TensorMap& tensors, const ModelSpec& spec,
                                                     int64_t image_size, const std::string& dir,
                                                     int64_t max_shard_bytes = kDiffusersShardBytes);
void export_upstream(const TensorMap& tensors, const std::string& path);
// Upstream's `pos_embed` buffer, which its .pth files hold and diffusers' single-file loader
// pops (it fails without it): [1, N, hidden] for the model.image_size grid of N tokens, the
// sin-cos table under model.use_pe, else zeros (as upstream registers it).
torch::Tensor upstream_pos_embed(const ModelSpec& spec, int64_t image_size);

}  // namespace sana::model
