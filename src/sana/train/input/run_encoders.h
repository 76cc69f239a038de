// The frozen encoders a run uses (the VAE and the text encoder: native ones from their
// Hugging Face folders, or TorchScript exports), as the config names them, what they hold
// before they are loaded, and the null caption they give: training, previews and
// prepare-features load them here, each logging what it loaded. Loading is local: no collective.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "sana/data/control_maps.h"
#include "sana/model/encoder_options.h"
#include "sana/model/encoders.h"
#include "sana/model/sana_ms.h"

namespace sana::train {

// The frozen encoders a run uses; either may be absent (pre-computed features, or none).
struct Encoders {
  std::shared_ptr<model::FrozenVae> vae;
  std::shared_ptr<model::FrozenTextEncoder> text;
  std::shared_ptr<model::FrozenHed> hed;  // a ControlNet on scribble or HED maps
};

// What the encoders are loaded for: training loads none whose features are pre-computed
// (data.load_vae_feat, data.load_text_feat); previews alone load the VAE to decode and,
// for a caption model with train.validation_prompts, the text encoder.
enum class EncoderUse { training, previews };

// The encoders a run names, by its keys (train/options/torch_options.h fills them from the config).
struct EncoderOptions {
  std::optional<model::VaeOptions> vae;           // vae.*: the run uses a VAE
  std::optional<model::TextEncoderOptions> text;  // text_encoder.*: the run uses a text encoder
  std::string hed_model;                          // controlnet.hed_model: a ControlNet on scribble or HED maps
  bool precomputed_latents = false;               // data.load_vae_feat
  bool precomputed_captions = false;              // data.load_text_feat
  bool validation_prompts = false;                // train.validation_prompts is not empty
};

// The encoders `use` needs (native ones from their folders, TorchScript exports), on `device`.
Encoders load_encoders(const EncoderOptions& o, torch::Device device, EncoderUse use, model::Conditioning conditioning);

// What one frozen encoder that load_encoders() would load holds on the device, counted before
// loading it: a native one from its config.json alone (its parameters in the dtype it runs
// in, model::native_encoder_dtype), a TorchScript export by its file's size. A native one's
// bytes equal what the loaded encoder holds (FrozenVae::bytes, FrozenTextEncoder::bytes).
struct EncoderWeights {
  std::string role;         // "VAE" or "text encoder"
  std::string what;         // "DC-AE", "Gemma-2", "TorchScript export"
  std::string source;       // the folder or file
  int64_t parameters = -1;  // -1: not known before loading (an export)
  int64_t bytes = 0;        // 0 when `missing`
  std::string dtype;        // "bf16" or "fp32"; "" for an export (its own)
  std::string missing;      // why it is not counted ("" when it is)
};
std::vector<EncoderWeights> encoder_weights(const EncoderOptions& o, bool cuda, EncoderUse use,
                                            model::Conditioning conditioning);
int64_t total_bytes(const std::vector<EncoderWeights>& encoders);

// A ControlNet's control maps (core_options.h's control_map_options_for) with the HED
// network of `encoders` for scribble and HED maps.
data::ControlMapOptions control_maps_for(data::ControlMapOptions maps, const Encoders& encoders);

// As upstream before training (from scratch: its train.py writes the empty prompt's
// features and sana.py loads them) and on loading weights: the null caption (y_embedding,
// used for caption dropout and guidance) becomes the text encoder's features of the empty
// prompt. Without a text encoder, the features in `null_embed_file` (config::null_embed_file(),
// "" for none). False (nothing changed) without either, or without a caption model.
bool use_empty_prompt(model::SanaMS& model, const Encoders& encoders, const std::string& null_embed_file = "");

}  // namespace sana::train
