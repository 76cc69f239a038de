// Where the text encoder a config names comes from, decided once for validation (an exit-2
// error before anything trains) and for loading (train/component_options.cpp):
//   - text_encoder.text_encoder_path a file: a TorchScript export (model/encoders.h);
//   - a folder, or a hub name ORG/NAME found on this machine (util/hf_hub.h): a transformers
//     Gemma-2 folder, run natively (model/gemma2.h);
//   - empty, with text_encoder_name one of upstream's Gemma-2 names: the folder of upstream's
//     hub repo for it (gemma-2-2b-it: Efficient-Large-Model/gemma-2-2b-it).
// Upstream's other encoders (T5, Qwen2, Gemma 1) run only as TorchScript exports. No torch.
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

}  // namespace sana::config
