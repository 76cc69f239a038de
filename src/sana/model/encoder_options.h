// What the frozen encoders (model/encoders.h) are loaded with. Fields carry the names of
// the keys they come from (vae.*, text_encoder.*), since errors name those keys;
// train/options/core_options.h fills them from the run's config. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sana::model {

struct VaeOptions {
  std::string vae_pretrained;        // the TorchScript export, or the AutoencoderDC folder
  bool dc_ae_folder = false;         // vae_pretrained is diffusers' AutoencoderDC folder
  std::string efficientvit_name;     // or efficientvit's folder of this DC-AE (dc-ae-f32c32-sana-1.1)
  double scale_factor = 0.41407;     // latents are multiplied by it after encoding
  int64_t vae_latent_dim = 32;       // channels the encoder must give
  int64_t vae_downsample_rate = 32;  // pixels per latent cell
  int64_t tile_size = 0;             // vae.tile_size: pixels per tile (0: whole images)
  int64_t tile_overlap = 0;          // vae.tile_overlap: pixels shared by neighbouring tiles
};

struct TextEncoderOptions {
  std::string text_encoder_name = "torchscript";  // upstream's name picks the caption pipeline
  std::string text_encoder_path;                  // the TorchScript export, or the Gemma-2 folder
  bool gemma2_folder = false;                     // text_encoder_path is transformers' Gemma-2 folder
  std::string tokenizer_path;                     // a SentencePiece model ("": the export tokenizes)
  int64_t caption_channels = 2304;                // features' width
  int64_t model_max_length = 300;                 // tokens per caption
  std::vector<std::string> chi_prompt;            // lines put before every caption
  // text_encoder.caption_cache_gib: host memory for the features of captions already encoded
  // (0: none); each distinct caption is then encoded once while it fits.
  int64_t caption_cache_bytes = int64_t{2} << 30;
};

}  // namespace sana::model
