#include "sana/model/diffusers_format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <filesystem>
#include <utility>

#include "sana/model/hf_weights.h"
#include "sana/model/weights.h"
#include "sana/util/safetensors.h"

namespace sana::model {

namespace {

namespace fs = std::filesystem;

// Renames by prefix, upstream's first: outside the blocks and inside one block.
const std::vector<std::pair<std::string, std::string>> kTop = {
    {"x_embedder.proj.", "patch_embed.proj."},
    {"t_embedder.mlp.0.", "time_embed.emb.timestep_embedder.linear_1."},
    {"t_embedder.mlp.2.", "time_embed.emb.timestep_embedder.linear_2."},
    {"t_block.1.", "time_embed.linear."},
    {"y_embedder.y_proj.fc1.", "caption_projection.linear_1."},
    {"y_embedder.y_proj.fc2.", "caption_projection.linear_2."},
    {"attention_y_norm.", "caption_norm."},
    {"final_layer.linear.", "proj_out."},
    {"final_layer.scale_shift_table", "scale_shift_table"},
};
// SANA-Sprint's student (diffusers' guidance_embeds): its time embedding is
// SanaCombinedTimestepGuidanceEmbeddings, and the guidance embedder sits beside it.
const std::vector<std::pair<std::string, std::string>> kGuidedTop = {
    {"t_embedder.mlp.0.", "time_embed.timestep_embedder.linear_1."},
    {"t_embedder.mlp.2.", "time_embed.timestep_embedder.linear_2."},
    {"cfg_embedder.mlp.0.", "time_embed.guidance_embedder.linear_1."},
    {"cfg_embedder.mlp.2.", "time_embed.guidance_embedder.linear_2."},
};
// The student's log-variance head, which diffusers' converter drops.
const char* const kLogvar = "logvar_linear.";
const std::vector<std::pair<std::string, std::string>> kBlock = {
    {"scale_shift_table", "scale_shift_table"},
    {"attn.proj.", "attn1.to_out.0."},
    {"attn.q_norm.", "attn1.norm_q."},
    {"attn.k_norm.", "attn1.norm_k."},
    {"cross_attn.q_linear.", "attn2.to_q."},
    {"cross_attn.proj.", "attn2.to_out.0."},
    {"cross_attn.q_norm.", "attn2.norm_q."},
    {"cross_attn.k_norm.", "attn2.norm_k."},
    {"mlp.inverted_conv.conv.", "ff.conv_inverted."},
    {"mlp.depth_conv.conv.", "ff.conv_depth."},
    {"mlp.point_conv.conv.", "ff.conv_point."},
};
// The two fused layers diffusers splits by rows, in row order.
const std::vector<std::pair<std::string, std::vector<std::string>>> kSplits = {
    {"attn.qkv", {"attn1.to_q", "attn1.to_k", "attn1.to_v"}},
    {"cross_attn.kv_linear", {"attn2.to_k", "attn2.to_v"}},
};
// Upstream's tensors diffusers' transformer does not have.
const std::set<std::string> kNotInDiffusers = {"y_embedder.y_embedding", "pos_embed"};
const char* const kUpstreamBlocks = "blocks.";
const char* const kDiffusersBlocks = "transformer_blocks.";

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// `name` renamed by the first rule whose `from` side is its prefix ("" when none applies).
std::string rename(const std::vector<std::pair<std::string, std::string>>& rules, const std::string& name,
                   bool forward) {
  for (const auto& [up, diff] : rules) {
    const auto& from = forward ? up : diff;
    const auto& to = forward ? diff : up;
    if (starts_with(name, from)) return to + name.substr(from.size());
  }
  return "";
}

// "blocks.12.attn.qkv.weight" -> {"12", "attn.qkv.weight"} (after `prefix`).
std::pair<std::string, std::string> split_block(const std::string& name, const std::string& prefix) {
  const auto rest = name.substr(prefix.size());
  const auto dot = rest.find('.');
  return {rest.substr(0, dot), dot == std::string::npos ? "" : rest.substr(dot + 1)};
}

// "attn1.to_k.weight" -> {"attn.qkv.weight", "attn1.to_k"}: the fused upstream tensor a
// diffusers block tensor is rows of, and which part; {"", ""} for any other.
std::pair<std::string, std::string> split_part(const std::string& rest) {
  for (const auto& [fused, names] : kSplits) {
    for (const auto& part : names) {
      if (starts_with(rest, part + ".")) return {fused + rest.substr(part.size()), part};
    }
  }
  return {"", ""};
}

[[noreturn]] void no_rule(const std::string& name, const char* direction) {
  throw WeightsError(fmt::format(
      "{}: no {} name for it (diffusers' SanaTransformer2DModel is the caption-conditioned Sana; a "
      "class-label or unconditioned model has no diffusers layout)",
      name, direction));
}

}  // namespace

bool is_diffusers_layout(const TensorMap& tensors) {
  for (const auto& [name, t] : tensors) {
    if (starts_with(name, kDiffusersBlocks) || starts_with(name, "patch_embed.")) return true;
  }
  return false;
}

TensorMap to_diffusers(const TensorMap& upstream) {
  TensorMap out;
  const bool guided = std::any_of(upstream.begin(), upstream.end(),
                                  [](const auto& item) { return starts_with(item.first, "cfg_embedder."); });
  for (const auto& [name, t] : upstream) {
    if (kNotInDiffusers.count(name) != 0 || starts_with(name, kLogvar)) continue;
    if (!starts_with(name, kUpstreamBlocks)) {
      auto renamed = guided ? rename(kGuidedTop, name, true) : "";
      if (renamed.empty()) renamed = rename(kTop, name, true);
      if (renamed.empty()) no_rule(name, "diffusers");
      out[renamed] = t;
      continue;
    }
    const auto [n, rest] = split_block(name, kUpstreamBlocks);
    const std::string to = kDiffusersBlocks + n + ".";
    const auto split = std::find_if(kSplits.begin(), kSplits.end(),
                                    [&](const auto& rule) { return starts_with(rest, rule.first + "."); });
    if (split != kSplits.end()) {
      const auto kind = rest.substr(split->first.size());  // ".weight" / ".bias"
      const auto& names = split->second;
      const auto parts = t.chunk(static_cast<int64_t>(names.size()), 0);
      for (size_t i = 0; i < names.size(); ++i) out[to + names[i] + kind] = parts[i].contiguous();
    } else {
      const auto renamed = rename(kBlock, rest, true);
      if (renamed.empty()) no_rule(name, "diffusers");
      out[to + renamed] = t;
    }
  }
  return out;
}

TensorMap controlnet_to_diffusers(const TensorMap& upstream) {
  static const std::vector<std::string> kEmbeddings = {"x_embedder.", "t_embedder.", "t_block.", "y_embedder.y_proj.",
                                                       "attention_y_norm."};
  const std::string control = "controlnet.";
  TensorMap picked, out;
  for (const auto& [name, t] : upstream) {
    if (!starts_with(name, control)) {
      const bool embedding = std::any_of(kEmbeddings.begin(), kEmbeddings.end(),
                                         [&](const std::string& p) { return starts_with(name, p); });
      if (embedding) picked[name] = t;
      continue;
    }
    const auto [n, rest] = split_block(name, control);
    const std::string copied = "copied_block.";
    if (starts_with(rest, copied)) {
      picked[kUpstreamBlocks + n + "." + rest.substr(copied.size())] = t;  // named as a block of the base
    } else if (n == "0" && starts_with(rest, "before_proj.")) {
      out["input_block." + rest.substr(std::string("before_proj.").size())] = t;
    } else if (starts_with(rest, "after_proj.")) {
      out["controlnet_blocks." + n + "." + rest.substr(std::string("after_proj.").size())] = t;
    } else {
      throw WeightsError(fmt::format("{}: no name for it in diffusers' SanaControlNetModel", name));
    }
  }
  for (auto& [name, t] : to_diffusers(picked)) out[name] = t;
  return out;
}

std::vector<DiffusersModule> diffusers_modules(const std::string& module, bool guided) {
  if (starts_with(module + ".", kLogvar)) return {};  // diffusers' converter drops it
  if (!starts_with(module, kUpstreamBlocks)) {
    auto renamed = guided ? rename(kGuidedTop, module + ".", true) : "";
    if (renamed.empty()) renamed = rename(kTop, module + ".", true);
    if (renamed.empty()) no_rule(module, "diffusers");
    return {{renamed.substr(0, renamed.size() - 1), 0, 1}};
  }
  const auto [n, rest] = split_block(module, kUpstreamBlocks);
  const std::string to = kDiffusersBlocks + n + ".";
  for (const auto& [fused, names] : kSplits) {
    if (rest != fused) continue;
    std::vector<DiffusersModule> out;
    for (size_t i = 0; i < names.size(); ++i) {
      out.push_back({to + names[i], static_cast<int64_t>(i), static_cast<int64_t>(names.size())});
    }
    return out;
  }
  const auto renamed = rename(kBlock, rest + ".", true);
  if (renamed.empty()) no_rule(module, "diffusers");
  return {{to + renamed.substr(0, renamed.size() - 1), 0, 1}};
}

TensorMap from_diffusers(const TensorMap& diffusers) {
  TensorMap out;
  // Parts of one upstream tensor: "blocks.N.attn.qkv.weight" -> {to_q, to_k, to_v}.
  std::map<std::string, std::vector<std::pair<std::string, torch::Tensor>>> groups;
  const auto part_of = [&](const std::string& whole, const std::string& part, const torch::Tensor& t) {
    groups[whole].emplace_back(part, t);
  };
  for (const auto& [name, t] : diffusers) {
    if (!starts_with(name, kDiffusersBlocks)) {
      auto renamed = rename(kTop, name, false);
      if (renamed.empty()) renamed = rename(kGuidedTop, name, false);
      if (renamed.empty()) no_rule(name, "upstream");
      out[renamed] = t;
      continue;
    }
    const auto [n, rest] = split_block(name, kDiffusersBlocks);
    const std::string to = kUpstreamBlocks + n + ".";
    const auto [fused, part] = split_part(rest);
    if (!fused.empty()) {
      part_of(to + fused, part, t);
    } else {
      const auto renamed = rename(kBlock, rest, false);
      if (renamed.empty()) no_rule(name, "upstream");
      out[to + renamed] = t;
    }
  }
  for (auto& [whole, parts] : groups) {
    const auto rule = std::find_if(kSplits.begin(), kSplits.end(), [&](const auto& r) {
      return whole.find("." + r.first + ".") != std::string::npos;
    });
    std::vector<torch::Tensor> rows;
    for (const auto& want : rule->second) {
      const auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& p) { return p.first == want; });
      if (it == parts.end()) {
        throw WeightsError(fmt::format("{}: diffusers' {} is missing (it needs {})", whole, want,
                                       fmt::join(rule->second, ", ")));
      }
      rows.push_back(it->second);
    }
    out[whole] = torch::cat(rows, 0);
  }
  return out;
}

nlohmann::json diffusers_config(const ModelSpec& spec, int64_t image_size) {
  const int64_t cross_dim = spec.hidden / spec.cross_heads;
  nlohmann::json c = {
      {"_class_name", "SanaTransformer2DModel"},
      {"in_channels", spec.in_channels},
      {"out_channels", spec.out_channels},
      {"num_attention_heads", spec.linear_heads()},
      {"attention_head_dim", spec.linear_head_dim},
      {"num_layers", spec.depth},
      {"num_cross_attention_heads", spec.cross_heads},
      {"cross_attention_head_dim", cross_dim},
      {"cross_attention_dim", spec.hidden},
      {"caption_channels", spec.caption_channels},
      {"mlp_ratio", spec.mlp_ratio},
      {"dropout", 0.0},
      {"attention_bias", false},
      {"sample_size", image_size / spec.downsample},
      {"patch_size", spec.patch},
      {"norm_elementwise_affine", false},
      {"norm_eps", 1e-6},
      {"interpolation_scale", nullptr},
      {"guidance_embeds", spec.cfg_embed},
      {"guidance_embeds_scale", spec.cfg_embed ? spec.cfg_embed_scale : 0.1},  // diffusers' default where unused
      {"qk_norm", spec.qk_norm ? nlohmann::json("rms_norm_across_heads") : nlohmann::json(nullptr)},
      // diffusers' pipeline multiplies its timesteps by it; ours divides: the inverse.
      {"timestep_scale", 1.0 / spec.timestep_norm_scale},
  };
  if (spec.use_pe) c["interpolation_scale"] = spec.pe_interpolation;
  return c;
}

nlohmann::json diffusers_controlnet_config(const ModelSpec& spec, int64_t image_size) {
  auto c = diffusers_config(spec, image_size);
  c["_class_name"] = "SanaControlNetModel";
  c["num_layers"] = spec.control_blocks;
  for (const char* field : {"guidance_embeds", "guidance_embeds_scale", "qk_norm", "timestep_scale"}) {
    c.erase(field);  // not SanaControlNetModel's
  }
  return c;
}

bool ConfigMismatch::fine_tune_may_change() const {
  return field == "qk_norm" || field == "timestep_scale" || field == "guidance_embeds";
}

std::vector<ConfigMismatch> config_mismatches(const nlohmann::json& config, const ModelSpec& spec) {
  const auto want = diffusers_config(spec, 0);
  std::vector<ConfigMismatch> out;
  for (const char* field : {"num_layers", "num_attention_heads", "attention_head_dim", "num_cross_attention_heads",
                            "cross_attention_head_dim", "cross_attention_dim", "caption_channels", "patch_size",
                            "in_channels", "out_channels", "qk_norm", "timestep_scale", "guidance_embeds"}) {
    if (!config.contains(field)) continue;  // diffusers' default applies; the tensors' shapes still must fit
    const auto& got = config.at(field);
    if (got != want.at(field)) {
      out.push_back({field, fmt::format("{}: file {}, preset {}", field, got.dump(), want.at(field).dump())});
    }
  }
  return out;
}

namespace {

constexpr const char* kStem = "diffusion_pytorch_model";

bool holds_transformer(const fs::path& dir) { return holds_hf_weights(dir.string(), kStem); }

// A pipeline's folder (Efficient-Large-Model/*_diffusers) holds the transformer in transformer/.
fs::path transformer_dir(const std::string& path) {
  const fs::path p(path);
  if (fs::is_directory(p) && !holds_transformer(p) && holds_transformer(p / "transformer")) return p / "transformer";
  return p;
}

}  // namespace

bool is_diffusers_folder(const std::string& path) {
  return fs::is_directory(path) && holds_transformer(transformer_dir(path));
}

nlohmann::json read_diffusers_config(const std::string& path) {
  return read_hf_config((fs::is_directory(path) ? transformer_dir(path) : fs::path(path).parent_path()).string());
}

DiffusersFiles read_diffusers(const std::string& path) {
  DiffusersFiles out;
  out.config = read_diffusers_config(path);
  if (fs::is_directory(path)) {
    out.tensors = read_hf_weights(transformer_dir(path).string(), kStem);
    return out;
  }
  try {  // one file
    for (auto& [name, t] : read_safetensors(path).tensors) out.tensors.emplace(name, t);
  } catch (const SafetensorsError& e) {
    throw WeightsError(e.what());
  }
  return out;
}

}  // namespace sana::model
