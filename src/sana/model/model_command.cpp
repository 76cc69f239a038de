#include "sana/model/model_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "sana/data/dataset.h"
#include "sana/diffusion/preview.h"
#include "sana/model/encoders.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::model {

namespace {

std::string thousands(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

struct BucketSize {
  int64_t base, height, width;
};

std::vector<BucketSize> buckets_to_show(const config::Config& cfg) {
  std::vector<BucketSize> out;
  for (const auto& table : data::bucket_tables_for(cfg)) {
    for (const auto& b : data::showcase_buckets(table)) out.push_back({table.base(), b.height, b.width});
  }
  return out;
}

// The config's spec, or nothing after logging why (validation normally catches it first).
std::optional<ModelSpec> spec_or_report(const config::Config& cfg) {
  try {
    return spec_from_config(cfg);
  } catch (const SpecError& e) {
    log::error("config error: {}", e.what());
    return std::nullopt;
  }
}

}  // namespace

int run_model_command(const config::Config& cfg, const ModelCommand& cmd) {
  const auto maybe_spec = spec_or_report(cfg);
  if (!maybe_spec) return kExitUsage;
  const ModelSpec& spec = *maybe_spec;
  SanaMS model(spec, BuildOptions{torch::kFloat32, /*meta=*/true, 0});
  const auto counts = model->parameter_counts();
  const int64_t total = model->parameter_count();
  const auto& all = presets();
  const auto preset = std::find_if(all.begin(), all.end(), [&](const Preset& p) { return p.name == spec.name; });
  const auto shown = buckets_to_show(cfg);

  if (cmd.json) {
    nlohmann::ordered_json j;
    j["model"] = spec.name;
    j["spec"] = {{"hidden", spec.hidden},
                 {"depth", spec.depth},
                 {"linear_heads", spec.linear_heads()},
                 {"linear_head_dim", spec.linear_head_dim},
                 {"cross_heads", spec.cross_heads},
                 {"patch", spec.patch},
                 {"mlp_hidden", spec.mlp_hidden()},
                 {"in_channels", spec.in_channels},
                 {"downsample", spec.downsample},
                 {"conditioning", conditioning_name(spec.conditioning)},
                 {"condition_tokens", spec.cond_tokens()}};
    nlohmann::ordered_json p;
    for (const auto& [name, n] : counts) p[name] = n;
    p["total"] = total;
    j["parameters"] = p;
    if (preset != all.end() && !preset->upstream_params.empty()) j["upstream_parameters"] = preset->upstream_params;
    j["flops"] = nlohmann::json::array();
    for (const auto& b : shown) {
      const auto f = forward_flops(spec, b.height, b.width);
      j["flops"].push_back({{"base", b.base},
                            {"height", b.height},
                            {"width", b.width},
                            {"tokens", f.tokens},
                            {"forward", f.total},
                            {"train", 3 * f.total}});
    }
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }

  std::cout << fmt::format(
      "{}: width {}, depth {}, {} linear-attention heads x {}, {} cross-attention heads, patch {}, "
      "GLUMBConv hidden {}\n",
      spec.name, spec.hidden, spec.depth, spec.linear_heads(), spec.linear_head_dim, spec.cross_heads,
      spec.patch, spec.mlp_hidden());
  std::cout << fmt::format(
      "input: {} channels ({}), conditioning: {}{}\n", spec.in_channels,
      spec.downsample == 1 ? "pixels" : fmt::format("latents, {} px per cell", spec.downsample),
      conditioning_name(spec.conditioning),
      spec.conditioning == Conditioning::caption
          ? fmt::format(" ({} tokens x {} features)", spec.caption_tokens, spec.caption_channels)
      : spec.conditioning == Conditioning::class_label ? fmt::format(" ({} classes + null)", spec.num_classes)
                                                       : "");
  std::cout << "\nparameters:\n";
  for (const auto& [name, n] : counts) std::cout << fmt::format("  {:<18} {:>15}\n", name, thousands(n));
  std::cout << fmt::format("  {:<18} {:>15}  ({:.3f} B)\n", "total", thousands(total), static_cast<double>(total) / 1e9);
  if (preset != all.end() && !preset->upstream_params.empty()) {
    std::cout << fmt::format("  upstream reports   {}\n", preset->upstream_params);
  }
  std::cout << "\nFLOPs per sample (2 x multiply-adds; a training step is about 3 x forward):\n";
  std::cout << fmt::format("  {:>5}  {:>11}  {:>7}  {:>14}  {:>14}\n", "base", "bucket", "tokens", "forward GFLOP",
                           "train GFLOP");
  for (const auto& b : shown) {
    const auto f = forward_flops(spec, b.height, b.width);
    std::cout << fmt::format("  {:>5}  {:>11}  {:>7}  {:>14.2f}  {:>14.2f}\n", b.base,
                             fmt::format("{}x{}", b.height, b.width), f.tokens, f.total / 1e9, 3 * f.total / 1e9);
  }
  return kExitOk;
}

int run_preview_command(const config::Config& cfg, const PreviewCommand& cmd) {
  const auto spec = spec_or_report(cfg);
  if (!spec) return kExitUsage;
  SanaMS model(*spec, BuildOptions{torch::kFloat32, false, static_cast<uint64_t>(cfg.train.seed)});
  if (!cmd.weights.empty()) {
    try {
      const auto report = load_weights(*model, cmd.weights, /*strict=*/true);
      log::info("weights: {} from {}", report.summary(), cmd.weights);
    } catch (const WeightsError& e) {
      log::error("{}", e.what());
      return kExitUsage;
    }
  } else {
    log::info("no --weights: previews of the initial weights (seed {})", cfg.train.seed);
  }
  auto o = diffusion::preview_options_for(cfg);
  const auto buckets = diffusion::preview_buckets_for(cfg);
  try {
    if (cfg.vae.vae_type == "torchscript") {
      auto vae = std::make_shared<FrozenVae>(FrozenVae::load(cfg.vae, torch::kCPU));
      if (vae->can_decode()) {
        o.decode = [vae](const torch::Tensor& z) { return vae->decode(z); };
      } else {
        log::warn("vae.vae_pretrained has no decode(): previews show latent channels 0-2");
      }
    }
    if (spec->conditioning == Conditioning::caption) {
      if (cfg.text_encoder.text_encoder_name == "torchscript" && !cfg.train.validation_prompts.empty()) {
        auto text = FrozenTextEncoder::load(cfg.text_encoder, torch::kCPU);
        std::tie(o.caption_features, o.caption_mask) = text.encode(cfg.train.validation_prompts);
      } else {
        log::warn("no text encoder or train.validation_prompts: caption previews use the null caption");
      }
    }
  } catch (const EncoderError& e) {
    log::error("{}", e.what());
    return kExitUsage;
  }
  const std::string dir = cmd.out.empty() ? (std::filesystem::path(cfg.work_dir) / "previews").string() : cmd.out;
  const auto start = std::chrono::steady_clock::now();
  const auto paths = diffusion::render_previews(model, buckets, o, dir, "preview");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& p : paths) std::cout << p << "\n";
  log::info("{} preview grids of {} images, {} {} steps, guidance {}, in {:.1f} s", paths.size(), o.images,
            o.sampler, o.steps, o.cfg_scale, secs);
  return kExitOk;
}

}  // namespace sana::model
