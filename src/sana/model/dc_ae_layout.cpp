// What an AutoencoderDC folder says: config.json's architecture, the tensors it makes, and
// efficientvit's names and architecture for the same network.
#include "sana/model/dc_ae.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "sana/model/hf_weights.h"
#include "sana/model/weights.h"

namespace sana::model {

namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// A per-stage field: a list of `n`, or one value for every stage (diffusers takes both).
template <typename T>
std::vector<T> per_stage(const nlohmann::json& c, const char* key, const std::vector<T>& fallback, size_t n,
                         const std::string& where) {
  if (!c.contains(key) || c.at(key).is_null()) return fallback.size() == 1 ? std::vector<T>(n, fallback[0]) : fallback;
  const auto& v = c.at(key);
  if (!v.is_array()) return std::vector<T>(n, config_field<T>(c, key, fallback[0], fallback[0], where));
  return config_field<std::vector<T>>(c, key, fallback, fallback, where);
}

void check_one_of(const std::vector<std::string>& values, const std::set<std::string>& allowed, const char* key,
                  const std::string& where) {
  for (const auto& v : values) {
    if (allowed.count(v) == 0) {
      throw WeightsError(fmt::format("{}: {} holds '{}'; the DC-AE built in has {}", where, key, v,
                                     fmt::join(allowed, ", ")));
    }
  }
}

DcAeConfig::Side side_of(const nlohmann::json& c, const std::string& prefix, const std::vector<int64_t>& layers,
                         const std::string& where) {
  const auto key = [&](const char* name) { return prefix + "_" + name; };
  DcAeConfig::Side s;
  s.channels = config_field<std::vector<int64_t>>(c, key("block_out_channels").c_str(),
                                                  {128, 256, 512, 512, 1024, 1024}, {128, 256, 512, 512, 1024, 1024},
                                                  where);
  const size_t n = s.channels.size();
  s.layers = config_field<std::vector<int64_t>>(c, key("layers_per_block").c_str(), layers, layers, where);
  s.block_types = per_stage<std::string>(c, key("block_types").c_str(), {"ResBlock"}, n, where);
  s.scales = config_field<std::vector<std::vector<int64_t>>>(c, key("qkv_multiscales").c_str(),
                                                             {{}, {}, {}, {5}, {5}, {5}}, {{}, {}, {}, {5}, {5}, {5}},
                                                             where);
  if (prefix == "decoder") {
    s.norms = per_stage<std::string>(c, "decoder_norm_types", {"rms_norm"}, n, where);
    s.acts = per_stage<std::string>(c, "decoder_act_fns", {"silu"}, n, where);
  } else {  // diffusers' Encoder builds every block with rms_norm and silu
    s.norms.assign(n, "rms_norm");
    s.acts.assign(n, "silu");
  }
  if (n < 2 || s.layers.size() != n || s.block_types.size() != n || s.scales.size() != n || s.norms.size() != n ||
      s.acts.size() != n) {
    throw WeightsError(fmt::format("{}: the {} lists have different lengths (block_out_channels {}, layers_per_block "
                                   "{}, block_types {}, qkv_multiscales {})",
                                   where, prefix, n, s.layers.size(), s.block_types.size(), s.scales.size()));
  }
  check_one_of(s.block_types, {"ResBlock", "EfficientViTBlock"}, (prefix + "_block_types").c_str(), where);
  check_one_of(s.norms, {"rms_norm", "batch_norm"}, "decoder_norm_types", where);
  check_one_of(s.acts, {"silu", "relu", "relu6"}, "decoder_act_fns", where);
  return s;
}

// The tensors of each module diffusers' AutoencoderDC builds, by its names.
struct ShapeWalk {
  const DcAeConfig& c;
  Shapes out;

  void add(const std::string& name, std::vector<int64_t> shape) { out.emplace_back(name, std::move(shape)); }
  void conv(const std::string& p, int64_t cout, int64_t cin, int64_t k, bool bias) {
    add(p + "weight", {cout, cin, k, k});
    if (bias) add(p + "bias", {cout});
  }
  void norm(const std::string& p, const std::string& type, int64_t ch) {
    add(p + "weight", {ch});
    add(p + "bias", {ch});
    if (type == "batch_norm") {
      add(p + "running_mean", {ch});
      add(p + "running_var", {ch});
    }
  }
  void block(const std::string& p, const DcAeConfig::Side& s, size_t i) {
    const int64_t ch = s.channels[i];
    if (s.block_types[i] == "ResBlock") {
      conv(p + "conv1.", ch, ch, 3, true);
      conv(p + "conv2.", ch, ch, 3, false);
      norm(p + "norm.", s.norms[i], ch);
      return;
    }
    const int64_t heads = ch / c.head_dim, inner = heads * c.head_dim;
    for (const char* x : {"to_q", "to_k", "to_v"}) add(p + "attn." + x + ".weight", {inner, ch});
    for (size_t k = 0; k < s.scales[i].size(); ++k) {
      const auto q = fmt::format("{}attn.to_qkv_multiscale.{}.", p, k);
      add(q + "proj_in.weight", {3 * inner, 1, s.scales[i][k], s.scales[i][k]});
      add(q + "proj_out.weight", {3 * inner, c.head_dim, 1, 1});
    }
    add(p + "attn.to_out.weight", {ch, inner * static_cast<int64_t>(1 + s.scales[i].size())});
    norm(p + "attn.norm_out.", s.norms[i], ch);
    conv(p + "conv_out.conv_inverted.", 8 * ch, ch, 1, true);
    conv(p + "conv_out.conv_depth.", 8 * ch, 1, 3, true);
    conv(p + "conv_out.conv_point.", ch, 4 * ch, 1, false);
    norm(p + "conv_out.norm.", "rms_norm", ch);
  }
  void walk() {
    const auto& e = c.encoder;
    const size_t n = e.channels.size();
    const int64_t first = e.layers[0] > 0 ? e.channels[0] : e.channels[1];
    if (e.layers[0] > 0) {
      conv("encoder.conv_in.", first, c.in_channels, 3, true);
    } else {
      conv("encoder.conv_in.conv.", c.pixel_unshuffle ? first / 4 : first, c.in_channels, 3, true);
    }
    for (size_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < e.layers[i]; ++j) block(fmt::format("encoder.down_blocks.{}.{}.", i, j), e, i);
      if (i + 1 < n && e.layers[i] > 0) {
        const int64_t out_ch = e.channels[i + 1];
        conv(fmt::format("encoder.down_blocks.{}.{}.conv.", i, e.layers[i]), c.pixel_unshuffle ? out_ch / 4 : out_ch,
             e.channels[i], 3, true);
      }
    }
    conv("encoder.conv_out.", c.latent_channels, e.channels[n - 1], 3, true);
    const auto& d = c.decoder;
    const size_t m = d.channels.size();
    conv("decoder.conv_in.", d.channels[m - 1], c.latent_channels, 3, true);
    for (size_t i = m; i-- > 0;) {
      int64_t j0 = 0;
      if (i + 1 < m && d.layers[i] > 0) {
        conv(fmt::format("decoder.up_blocks.{}.0.conv.", i), c.interpolate ? d.channels[i] : 4 * d.channels[i],
             d.channels[i + 1], 3, true);
        j0 = 1;
      }
      for (int64_t j = 0; j < d.layers[i]; ++j) block(fmt::format("decoder.up_blocks.{}.{}.", i, j0 + j), d, i);
    }
    const int64_t last = d.layers[0] > 0 ? d.channels[0] : d.channels[1];
    norm("decoder.norm_out.", "rms_norm", last);
    if (d.layers[0] > 0) {
      conv("decoder.conv_out.", c.in_channels, last, 3, true);
    } else {
      conv("decoder.conv_out.conv.", c.interpolate ? c.in_channels : 4 * c.in_channels, last, 3, true);
    }
  }
};

}  // namespace

// mit-han-lab's efficientvit names to diffusers', as diffusers' converter renames them
// (convert_autoencoder_dc_checkpoint_to_diffusers): these replacements, in this order, on
// every name; then the fused qkv 1x1 convolution split in three and the output projection
// squeezed to linear weights.
std::map<std::string, torch::Tensor> diffusers_names(std::map<std::string, torch::Tensor> in) {
  // Without encoder.project_in.conv.bias the first and last convolutions are samplers.
  const bool sampler_ends = in.count("encoder.project_in.conv.bias") == 0;
  const std::vector<std::pair<std::string, std::string>> renames = {
      {"main.", ""},
      {"op_list.", ""},
      {"context_module", "attn"},
      {"local_module", "conv_out"},
      {"aggreg.0.0", "to_qkv_multiscale.0.proj_in"},
      {"aggreg.0.1", "to_qkv_multiscale.0.proj_out"},
      {"depth_conv.conv", "conv_depth"},
      {"inverted_conv.conv", "conv_inverted"},
      {"point_conv.conv", "conv_point"},
      {"point_conv.norm", "norm"},
      {"conv.conv.", "conv."},
      {"conv1.conv", "conv1"},
      {"conv2.conv", "conv2"},
      {"conv2.norm", "norm"},
      {"proj.norm", "norm_out"},
      {"encoder.project_in.conv", sampler_ends ? "encoder.conv_in.conv" : "encoder.conv_in"},
      {"encoder.project_out.0.conv", "encoder.conv_out"},
      {"encoder.stages", "encoder.down_blocks"},
      {"decoder.project_in.conv", "decoder.conv_in"},
      {"decoder.project_out.0", "decoder.norm_out"},
      {"decoder.project_out.2.conv", sampler_ends ? "decoder.conv_out.conv" : "decoder.conv_out"},
      {"decoder.stages", "decoder.up_blocks"},
  };
  std::map<std::string, torch::Tensor> out;
  for (auto& [key, tensor] : in) {
    std::string name = key;
    for (const auto& [from, to] : renames) {
      for (size_t at = name.find(from); at != std::string::npos; at = name.find(from, at + to.size())) {
        name.replace(at, from.size(), to);
      }
    }
    const auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with(".qkv.conv.weight")) {
      const auto parent = name.substr(0, name.size() - std::string(".qkv.conv.weight").size());
      const auto parts = tensor.chunk(3, 0);
      out[parent + ".to_q.weight"] = parts[0].squeeze();
      out[parent + ".to_k.weight"] = parts[1].squeeze();
      out[parent + ".to_v.weight"] = parts[2].squeeze();
    } else if (ends_with(".proj.conv.weight")) {
      out[name.substr(0, name.size() - std::string(".proj.conv.weight").size()) + ".to_out.weight"] = tensor.squeeze();
    } else {
      out[name] = tensor;
    }
  }
  return out;
}

bool is_dc_ae_config(const nlohmann::json& config) {
  return config.is_object() && config.value("_class_name", "") == "AutoencoderDC";
}

const std::vector<std::string>& efficientvit_names() {
  static const std::vector<std::string> names = {"dc-ae-f32c32-sana-1.0", "dc-ae-f32c32-sana-1.1"};
  return names;
}

bool DcAeConfig::for_efficientvit(const std::string& name, DcAeConfig& out) {
  const auto& names = efficientvit_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) return false;
  // Sana's DC-AE, as diffusers' convert_dcae_to_diffusers.py builds it (1.1 fine-tunes 1.0).
  DcAeConfig g;
  for (auto* s : {&g.encoder, &g.decoder}) {
    s->channels = {128, 256, 512, 512, 1024, 1024};
    s->block_types = {"ResBlock", "ResBlock", "ResBlock", "EfficientViTBlock", "EfficientViTBlock", "EfficientViTBlock"};
    s->scales = {{}, {}, {}, {5}, {5}, {5}};
    s->norms.assign(6, "rms_norm");
    s->acts.assign(6, "silu");
  }
  g.encoder.layers = {2, 2, 2, 3, 3, 3};
  g.decoder.layers = {3, 3, 3, 3, 3, 3};
  g.pixel_unshuffle = false;
  g.interpolate = true;
  g.scaling_factor = 0.41407;
  out = g;
  return true;
}

DcAeConfig DcAeConfig::from_json(const nlohmann::json& c, const std::string& where) {
  if (!is_dc_ae_config(c)) {
    throw WeightsError(fmt::format("{}: _class_name is {}, not AutoencoderDC (the VAE built in is diffusers' "
                                   "AutoencoderDC; give its diffusers folder, e.g. "
                                   "mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers)",
                                   where, c.is_object() && c.contains("_class_name") ? c.at("_class_name").dump()
                                                                                       : "missing"));
  }
  DcAeConfig g;
  g.in_channels = config_field<int64_t>(c, "in_channels", 3, 3, where);
  g.latent_channels = config_field<int64_t>(c, "latent_channels", 32, 32, where);
  g.head_dim = config_field<int64_t>(c, "attention_head_dim", 32, 32, where);
  g.encoder = side_of(c, "encoder", {2, 2, 2, 3, 3, 3}, where);
  g.decoder = side_of(c, "decoder", {3, 3, 3, 3, 3, 3}, where);
  // diffusers: pixel_unshuffle / interpolate exactly; any other name is the other kind.
  g.pixel_unshuffle = config_field<std::string>(c, "downsample_block_type", "pixel_unshuffle", "", where) ==
                      "pixel_unshuffle";
  g.interpolate = config_field<std::string>(c, "upsample_block_type", "pixel_shuffle", "", where) == "interpolate";
  g.encoder_out_shortcut = config_field<bool>(c, "encoder_out_shortcut", true, true, where);
  g.decoder_in_shortcut = config_field<bool>(c, "decoder_in_shortcut", true, true, where);
  g.decoder_conv_act = config_field<std::string>(c, "decoder_conv_act_fn", "relu", "relu", where);
  check_one_of({g.decoder_conv_act}, {"silu", "relu", "relu6"}, "decoder_conv_act_fn", where);
  g.scaling_factor = config_field<double>(c, "scaling_factor", 1.0, 1.0, where);
  for (const auto* s : {&g.encoder, &g.decoder}) {
    for (size_t i = 0; i < s->channels.size(); ++i) {
      if (s->block_types[i] == "EfficientViTBlock" && (s->channels[i] % g.head_dim != 0)) {
        throw WeightsError(fmt::format("{}: a stage of {} channels does not split into heads of attention_head_dim {}",
                                       where, s->channels[i], g.head_dim));
      }
    }
  }
  if (g.encoder.channels.size() != g.decoder.channels.size()) {
    throw WeightsError(fmt::format("{}: the encoder has {} stages, the decoder {}", where, g.encoder.channels.size(),
                                   g.decoder.channels.size()));
  }
  return g;
}

Shapes DcAe::tensor_shapes(const DcAeConfig& config) {
  ShapeWalk walk{config, {}};
  walk.walk();
  return walk.out;
}

namespace {
int64_t count_elements(const DcAeConfig& config, bool statistics) {
  int64_t n = 0;
  for (const auto& [name, shape] : DcAe::tensor_shapes(config)) {
    if (!statistics && name.find("running_") != std::string::npos) continue;
    int64_t e = 1;
    for (const auto d : shape) e *= d;
    n += e;
  }
  return n;
}
}  // namespace

int64_t DcAeConfig::parameters() const { return count_elements(*this, false); }
int64_t DcAeConfig::elements() const { return count_elements(*this, true); }

}  // namespace sana::model
