// Frozen encoders exported from Python with TorchScript (torch.jit.script / trace + save),
// for users who train from raw images and captions instead of precomputed features:
//  - a VAE: a module with a method `encode(images) -> latents` (images [B, 3, H, W] in
//    [-1, 1]); an optional `decode(latents) -> images` draws latent-space previews. The
//    latents are multiplied by vae.scale_factor here, as upstream does after encoding. Or
//    diffusers' AutoencoderDC folder (model/dc_ae.h), run natively in bf16 on CUDA and fp32
//    on the CPU;
//  - a text encoder: `forward(prompts: List[str]) -> (features [N, T, D], mask [N, T])`,
//    tokenizer included; or, with text_encoder.tokenizer_path (model/tokenizer.h), one that
//    takes `forward(input_ids [N, T], attention_mask [N, T]) -> features [N, T, D]` (or a
//    tuple whose first element they are: a traced decoder's last hidden state). Around it,
//    upstream's caption pipeline: the CHI prompt in front, T = its tokens + L - 2, and token 0
//    plus the last L - 1 kept (L = model_max_length);
//  - or transformers' Gemma-2 folder (text_encoder_path a folder, model/gemma2.h), run natively
//    in bf16 on CUDA and fp32 on the CPU, its tokenizer.model around it as above.
// Every output is checked against the config (channels, downsampling, tokens, width), so a
// wrong export is a clear error at start, not a shape error deep in the model.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sana/model/dc_ae.h"
#include "sana/model/encoder_options.h"
#include "sana/model/gemma2.h"
#include "sana/model/tokenizer.h"
#include "sana/util/error.h"

namespace sana::model {

class EncoderError : public sana::UsageError {
 public:
  explicit EncoderError(const std::string& what) : UsageError(what, "encoder error") {}
};

// The dtype the native encoders (DC-AE, Gemma-2) keep their weights and run in: bf16 on CUDA
// (upstream's), fp32 on the CPU.
torch::ScalarType native_encoder_dtype(bool cuda);

class FrozenVae {
 public:
  // Loads vae.vae_pretrained and checks it on a small image of `probe_size` pixels.
  static FrozenVae load(const VaeOptions& cfg, torch::Device device, int64_t probe_size = 64);
  // -> [B, latent_dim, H/f, W/f] * scale. With vae.tile_size, an image larger than a tile
  // is encoded tile by tile (tiles of tile_size, each tile_size - tile_overlap pixels after
  // the one before, the last of a row or column moved back to end at the edge) and the
  // tiles' latents blended where they overlap: each weighted by a ramp that rises from the
  // tile's inner edges over the overlap, the sum divided by the weights'. A VAE whose
  // latent cell sees only its own pixels gives the whole image's latents exactly.
  torch::Tensor encode(const torch::Tensor& images);
  bool can_decode() const { return can_decode_; }
  torch::Tensor decode(const torch::Tensor& latents);  // latents / scale -> images in [-1, 1]
  int64_t bytes() const;  // its weights (and buffers) as loaded on the device

 private:
  void load_torchscript(const VaeOptions& cfg);
  torch::Tensor encode_whole(const torch::Tensor& images);
  torch::Tensor encode_tiled(const torch::Tensor& images);
  torch::jit::Module module_;
  std::shared_ptr<const DcAe> dc_ae_;  // in place of module_ for an AutoencoderDC folder
  VaeOptions cfg_;
  torch::Device device_ = torch::kCPU;
  bool can_decode_ = false;
};

// The features of captions already encoded, in host memory up to a byte budget: once full it
// keeps what it has and takes no more (a run's epochs meet captions in a cycle, which would
// evict every entry before its next use).
struct CaptionCache;

class FrozenTextEncoder {
 public:
  // Loads text_encoder.text_encoder_path and checks it on a probe prompt.
  static FrozenTextEncoder load(const TextEncoderOptions& cfg, torch::Device device);
  // features [N, model_max_length, caption_channels], mask [N, model_max_length]. Each caption
  // is encoded alone, so its features are a function of the caption only (not of the batch
  // it came in, the process count, or whether it came from the cache); a caption seen before
  // comes from the cache (text_encoder.caption_cache_gib), bit for bit what encoding it gave.
  std::pair<torch::Tensor, torch::Tensor> encode(const std::vector<std::string>& prompts);
  struct CacheStats {
    int64_t hits = 0, misses = 0;    // captions served from the cache, and encoded
    int64_t entries = 0, bytes = 0;  // what it holds
    bool full = false;               // a caption did not fit the budget
  };
  CacheStats cache_stats() const;
  // Upstream's null caption: the empty prompt's features, without CHI prompt or token
  // selection, [model_max_length, caption_channels].
  torch::Tensor empty_prompt();
  int64_t bytes() const;  // its weights (and buffers) as loaded on the device

 private:
  // The module's features [N, T, D] and mask [N, T] for `texts` (T = `length` with a tokenizer).
  std::pair<torch::Tensor, torch::Tensor> run(const std::vector<std::string>& texts, int64_t length);
  // One caption's features [1, L, C] and mask [1, L], upstream's rules around run().
  std::pair<torch::Tensor, torch::Tensor> encode_one(const std::string& prompt);
  std::pair<torch::Tensor, torch::Tensor> checked(std::pair<torch::Tensor, torch::Tensor> out, int64_t n) const;

  torch::jit::Module module_;
  std::shared_ptr<const Gemma2> gemma_;  // in place of module_ for a Gemma-2 folder
  std::shared_ptr<CaptionTokenizer> tokenizer_;
  std::shared_ptr<CaptionCache> cache_;  // shared by copies
  TextEncoderOptions cfg_;
  torch::Device device_ = torch::kCPU;
};

// Upstream's HED edge network for ControlNet's scribble and HED maps (ControlNetHED_Apache2
// with lllyasviel's ControlNetHED.pth, exported with TorchScript by scripts/export_hed.py):
// forward(x [1, 3, H, W], RGB 0-255) returns its five side outputs [1, 1, h_i, w_i].
// edges() is upstream's HEDdetector: each output resized bilinearly to H x W, their mean
// through a sigmoid, x 255, truncated to 8 bits. On the CPU (the loader's workers call it;
// one call at a time).
class FrozenHed {
 public:
  // Loads controlnet.hed_model and checks it on a 64 x 64 image.
  static std::shared_ptr<FrozenHed> load(const std::string& path);
  // [H, W, 3] uint8 RGB -> [H, W] uint8 edges.
  torch::Tensor edges(const torch::Tensor& rgb);

 private:
  torch::jit::Module module_;
  std::string path_;
  std::mutex mutex_;
};

}  // namespace sana::model
