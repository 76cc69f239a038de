#include "sana/config/encoder_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "sana/config/upstream.h"
#include "sana/util/hf_hub.h"

namespace sana::config {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTorchScriptHint =
    "or export the encoder to TorchScript (docs/encoders.md) and give the file, or precompute features and set "
    "data.load_text_feat: true";

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// A Gemma-2 folder found for `name` (the key's value or upstream's repo), or the error.
TextEncoderSource from_folder(const std::string& name, const TextEncoderConfig& text) {
  TextEncoderSource s;
  const auto lookup = hub::find_model(name);
  if (lookup.folder.empty()) {
    s.problem = hub::not_found_text(name, lookup);
    s.hint = fmt::format("the folder is transformers' Gemma-2 (config.json, model*.safetensors, tokenizer.model); {}",
                         kTorchScriptHint);
    return s;
  }
  s.kind = TextEncoderSource::Kind::gemma2;
  s.path = lookup.folder;
  s.tokenizer = text.tokenizer_path.empty() ? (fs::path(lookup.folder) / "tokenizer.model").string()
                                            : text.tokenizer_path;
  return s;
}

}  // namespace

TextEncoderSource text_encoder_source(const TextEncoderConfig& text) {
  TextEncoderSource s;
  const std::string& name = text.text_encoder_name;
  if (name == "none") return s;
  const std::string hub = text_encoder_hub_name(name);
  const bool gemma2_name = !hub.empty() || name == "torchscript";
  const auto natives = fmt::format("{}", fmt::join(native_text_encoder_names(), ", "));
  const std::string& path = text.text_encoder_path;
  if (!path.empty() && !is_dir(path) && !(hub::is_hub_name(path) && looks_like_hub_name(path))) {
    s.kind = TextEncoderSource::Kind::torchscript;  // a file (validation says when it is missing)
    s.path = path;
    s.tokenizer = text.tokenizer_path;
    return s;
  }
  if (!gemma2_name) {
    s.problem = path.empty()
                    ? fmt::format("is empty, and text_encoder_name {} has no native encoder here", name)
                    : fmt::format("'{}' is a folder or hub name, and text_encoder_name {} has no native encoder here",
                                  path, name);
    s.hint = fmt::format("sana-train runs Gemma-2 natively ({}) from its transformers folder; give a TorchScript "
                         "export of {} in text_encoder.text_encoder_path, or precompute features and set "
                         "data.load_text_feat: true",
                         natives, name);
    return s;
  }
  if (path.empty() && hub.empty()) {  // torchscript with no file
    s.problem = "is empty, but text_encoder_name is torchscript";
    s.hint = fmt::format("give the TorchScript export, or a Gemma-2 folder (or set text_encoder_name to one of {})",
                         natives);
    return s;
  }
  return from_folder(path.empty() ? hub : path, text);
}

}  // namespace sana::config
