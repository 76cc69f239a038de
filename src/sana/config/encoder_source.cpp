#include "sana/config/encoder_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  if (path.empty() && hub.empty()) {  // torchscript with no file: validation names the key
    s.kind = TextEncoderSource::Kind::torchscript;
    return s;
  }
  if (!path.empty()) return from_folder(path, text);
  auto found = from_folder(hub, text);
  if (!found.problem.empty()) {
    found.problem = fmt::format("is empty, so text_encoder_name {} is upstream's {}: {}", name, hub, found.problem);
  }
  return found;
}

VaeSource vae_source(const VaeConfig& vae) {
  VaeSource s;
  if (vae.vae_type == VaeType::none) return s;
  const std::string& path = vae.vae_pretrained;
  if (path.empty() || (!is_dir(path) && !(hub::is_hub_name(path) && looks_like_hub_name(path)))) {
    s.kind = VaeSource::Kind::torchscript;  // a file, or none (validation names the key)
    s.path = path;
    return s;
  }
  const auto lookup = hub::find_model(path);
  // mit-han-lab publishes each Sana DC-AE twice: NAME (efficientvit's layout) and NAME-diffusers.
  const bool diffusers_name = path.size() > 10 && path.compare(path.size() - 10, 10, "-diffusers") == 0;
  if (lookup.folder.empty()) {
    s.problem = hub::not_found_text(path, lookup);
    s.hint = "the folder is diffusers' AutoencoderDC (config.json, diffusion_pytorch_model*.safetensors); or export "
             "the VAE to TorchScript (docs/encoders.md) and give the file, or precompute features and set "
             "data.load_vae_feat: true";
    if (!diffusers_name && hub::is_hub_name(path)) {
      s.hint = fmt::format("(efficientvit's layout of Sana's DC-AE is read too; its diffusers repo is {}-diffusers) ",
                           path) + s.hint;
    }
    return s;
  }
  nlohmann::json config;
  std::ifstream in(fs::path(lookup.folder) / "config.json");
  if (in) config = nlohmann::json::parse(in, nullptr, false);
  if (!config.is_object() || config.value("_class_name", "") != "AutoencoderDC") {
    // efficientvit's layout: the DC-AE its name says.
    s.kind = VaeSource::Kind::dc_ae_efficientvit;
    s.path = lookup.folder;
    if (hub::is_hub_name(path) && !is_dir(path)) {
      s.name = path.substr(path.find('/') + 1);
    } else if (config.is_object() && config.contains("model_name") && config.at("model_name").is_string()) {
      s.name = config.at("model_name").get<std::string>();
    } else {
      s.name = fs::path(lookup.folder).lexically_normal().filename().string();
    }
    return s;
  }
  s.kind = VaeSource::Kind::dc_ae;
  s.path = lookup.folder;
  return s;
}

}  // namespace sana::config
