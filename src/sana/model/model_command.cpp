#include "sana/model/model_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "sana/data/buckets.h"
#include "sana/model/sana_ms.h"
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
  std::string key;
};

// Square, tallest and widest bucket of every base size the config trains.
std::vector<BucketSize> buckets_to_show(const config::Config& cfg) {
  std::vector<int64_t> sizes = cfg.data.multi_scale_sizes;
  sizes.insert(sizes.begin(), cfg.data.image_size);
  std::vector<BucketSize> out;
  for (int64_t size : sizes) {
    data::BucketTable table =
        !cfg.model.multi_scale ? data::BucketTable::square(static_cast<int>(size))
        : cfg.data.aspect_ratio_type == "generated"
            ? data::BucketTable::generated(static_cast<int>(size), static_cast<int>(cfg.data.bucket_step))
            : data::BucketTable::upstream("ASPECT_RATIO_" + std::to_string(size));
    const auto& b = table.buckets();
    const auto square = std::min_element(b.begin(), b.end(), [](const auto& x, const auto& y) {
      return std::abs(std::log(x.ratio)) < std::abs(std::log(y.ratio));
    });
    const auto [tall, wide] = std::minmax_element(b.begin(), b.end(), [](const auto& x, const auto& y) {
      return static_cast<double>(x.width) / x.height < static_cast<double>(y.width) / y.height;
    });
    for (auto it : {square, tall, wide}) {
      const BucketSize s{size, it->height, it->width, it->key};
      const bool seen = std::any_of(out.begin(), out.end(), [&](const BucketSize& o) {
        return o.height == s.height && o.width == s.width;
      });
      if (!seen) out.push_back(s);
    }
  }
  return out;
}

}  // namespace

int run_model_command(const config::Config& cfg, const ModelCommand& cmd) {
  ModelSpec spec;
  try {
    spec = spec_from_config(cfg);
  } catch (const SpecError& e) {
    log::error("config error: {}", e.what());
    return kExitUsage;
  }
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

}  // namespace sana::model
