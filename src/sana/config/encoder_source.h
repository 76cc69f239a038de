// Where the text encoder a config names comes from, decided once for validation (an exit-2
// error before anything trains) and for loading (train/options/core_options.cpp):
//   - text_encoder.text_encoder_path a file: a TorchScript export (model/encoders.h);
//   - a folder, or a hub name ORG/NAME found on this machine (util/hf_hub.h): a transformers
//     Gemma-2 folder, run natively (model/gemma2.h);
//   - empty, with text_encoder_name one of upstream's Gemma-2 names: the folder of upstream's
//     hub repo for it (gemma-2-2b-it: Efficient-Large-Model/gemma-2-2b-it).
// Upstream's other encoders (T5, Qwen2, Gemma 1) run only as TorchScript exports. And the VAE:
//   - vae.vae_pretrained a file: a TorchScript export;
//   - a folder, or a hub name found on this machine: diffusers' AutoencoderDC folder (its
//     config.json's _class_name), run natively (model/dc_ae.h); any other folder is taken as
//     mit-han-lab's efficientvit layout of the DC-AE its name says (dc-ae-f32c32-sana-1.1:
//     the hub name's, else config.json's model_name, else the folder's), which model/dc_ae.h
//     reads for Sana's two and refuses, naming the -diffusers repo, for any other.
// No torch.
#pragma once

#include <string>

#include "sana/config/config.h"

namespace sana::config {

struct TextEncoderSource {
  enum class Kind { none, torchscript, gemma2 };
  Kind kind = Kind::none;
  std::string path;       // the TorchScript file or the Gemma-2 folder
  std::string tokenizer;  // text_encoder.tokenizer_path, else a Gemma-2 folder's tokenizer.model
  std::string problem;    // why the config gives no usable encoder ("" when it does)
  std::string hint;       // what to do about it
};

// None for text_encoder_name none. Looks at the file system (existence only, nothing read).
TextEncoderSource text_encoder_source(const TextEncoderConfig& text);

struct VaeSource {
  enum class Kind { none, torchscript, dc_ae, dc_ae_efficientvit };
  Kind kind = Kind::none;
  std::string path;     // the TorchScript file or the AutoencoderDC folder
  std::string name;     // dc_ae_efficientvit: the DC-AE's name (dc-ae-f32c32-sana-1.1)
  std::string problem;  // why the config gives no usable VAE ("" when it does)
  std::string hint;
};

// None for vae_type none. Reads a folder's config.json (its _class_name) and nothing else.
VaeSource vae_source(const VaeConfig& vae);

}  // namespace sana::config
