#include "sana/train/previews/sampling.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <opencv2/imgcodecs.hpp>

#include "sana/data/dataset.h"
#include "sana/diffusion/flow_matching.h"
#include "sana/diffusion/sampler.h"
#include "sana/model/trigflow.h"

namespace sana::train {

using diffusion::guided;
using diffusion::SampleKey;
using diffusion::sample_flow;
using diffusion::sample_generator;
using diffusion::Velocity;

namespace {

// Restores the module's training flag however the preview ends.
struct EvalMode {
  explicit EvalMode(model::SanaMS& m) : model(m), was_training(m->is_training()) { model->eval(); }
  ~EvalMode() { model->train(was_training); }
  model::SanaMS& model;
  bool was_training;
};

// The conditions of a preview batch, conditioned and unconditioned halves of one doubled
// batch; `guide` turns false where there is nothing to guide by.
model::Condition guided_condition(const model::ModelSpec& spec, const PreviewOptions& o, bool& guide) {
  const int64_t n = o.images;
  model::Condition both;
  if (spec.conditioning == model::Conditioning::class_label) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(o.classes.empty() ? i % spec.num_classes : o.classes[static_cast<size_t>(i) % o.classes.size()]);
    }
    const auto labels = torch::tensor(ids, torch::kInt64);
    both.y = torch::cat({labels, labels}).to(o.device);
    both.drop = torch::cat({torch::zeros({n}, torch::kBool), torch::ones({n}, torch::kBool)}).to(o.device);
  } else if (spec.conditioning == model::Conditioning::caption) {
    torch::Tensor feats = o.caption_features, mask = o.caption_mask;
    const bool have = feats.defined();
    if (!have) {  // no prompts: the null caption, unguided
      feats = torch::zeros({1, spec.caption_tokens, spec.caption_channels});
      guide = false;
    }
    const auto pick = torch::arange(n, torch::kInt64) % feats.size(0);
    feats = feats.index_select(0, pick);
    mask = mask.defined() ? mask.index_select(0, pick) : torch::ones({n, spec.caption_tokens}, torch::kInt64);
    both.y = torch::cat({feats, feats}).to(o.device);
    both.mask = torch::cat({mask, mask}).to(o.device);
    both.drop = torch::cat({torch::full({n}, !have, torch::kBool), torch::ones({n}, torch::kBool)}).to(o.device);
  } else {
    guide = false;
  }
  return both;
}

// The conditioned half of guided_condition's doubled batch (and its control).
model::Condition first_half(const model::Condition& both, int64_t n, bool conditioned, bool controlled,
                            const PreviewOptions& o) {
  model::Condition single;
  if (controlled) {
    single.control = both.control.narrow(0, 0, n);
    single.control_scale = o.control_scale;
  }
  if (conditioned) {
    single.y = both.y.narrow(0, 0, n);
    if (both.mask.defined()) single.mask = both.mask.narrow(0, 0, n);
    single.drop = both.drop.narrow(0, 0, n);
  }
  return single;
}

// Sampled latents (or pixels) as images in [-1, 1]: the decoder's, or a latent model's
// channels 0-2 each stretched to [-1, 1] without one.
torch::Tensor to_images(const torch::Tensor& x0, const model::ModelSpec& spec, const PreviewOptions& o) {
  if (o.decode) return o.decode(x0);
  if (spec.in_channels == 3) return x0;
  const int64_t n = x0.size(0);
  auto images = x0.narrow(1, 0, std::min<int64_t>(3, spec.in_channels));
  if (images.size(1) < 3) images = images.narrow(1, 0, 1).expand({-1, 3, -1, -1});
  const auto flat = images.reshape({n, -1});
  const auto lo = std::get<0>(flat.min(1)).view({n, 1, 1, 1}), hi = std::get<0>(flat.max(1)).view({n, 1, 1, 1});
  return (images - lo) / (hi - lo).clamp_min(1e-8) * 2 - 1;
}

}  // namespace

std::vector<torch::Tensor> sample_previews(model::SanaMS& model, const std::vector<PreviewBucket>& buckets,
                                           const PreviewOptions& o) {
  const auto& spec = model->spec();
  EvalMode eval(model);
  torch::NoGradGuard no_grad;
  const int64_t n = o.images;
  bool guide = o.cfg_scale != 1.0;
  model::Condition both = guided_condition(spec, o, guide);
  const bool conditioned = spec.conditioning != model::Conditioning::none;
  const bool controlled = spec.control_blocks > 0 && !o.control_images.empty();

  std::vector<torch::Tensor> out;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t h = buckets[b].height / spec.downsample, w = buckets[b].width / spec.downsample;
    std::vector<torch::Tensor> noise;
    for (int64_t i = 0; i < n; ++i) {
      const auto gen = sample_generator(SampleKey{o.seed, static_cast<int64_t>(b), static_cast<uint64_t>(i)}, "preview");
      noise.push_back(torch::randn({spec.in_channels, h, w}, gen, torch::kFloat32));
    }
    const auto x1 = torch::stack(noise).to(o.device);
    torch::Tensor maps;  // ControlNet: the same control for the guided and unguided halves, as upstream's pipeline
    if (controlled) {
      maps = preview_controls(o, n, buckets[b].height, buckets[b].width);
      const auto control = o.encode ? o.encode(maps.to(o.device)) : maps.to(o.device);
      both.control = torch::cat({control, control});
      both.control_scale = o.control_scale;
    }
    auto run = [&](const torch::Tensor& x, double sigma, const model::Condition& c) {
      const auto t = torch::full({x.size(0)}, sigma * 1000.0, torch::TensorOptions().device(o.device));
      auto v = model->forward(x, t, c).to(torch::kFloat32);
      if (o.on_step) o.on_step();
      return v;
    };
    if (spec.trigflow) {  // SANA-Sprint's student: guidance by its embedding, fresh noise every step
      auto single = first_half(both, n, conditioned, false, o);
      single.cfg_scale = torch::full({n}, o.cfg_scale, torch::TensorOptions().device(o.device));
      const auto times = diffusion::scm_times(o.steps, 1.5708, o.scm_mid);
      std::vector<torch::Tensor> step_noise;
      for (int k = 0; k + 1 < static_cast<int>(times.size()); ++k) {
        std::vector<torch::Tensor> z;
        for (int64_t i = 0; i < n; ++i) {
          const auto gen = sample_generator(SampleKey{o.seed, static_cast<int64_t>(b), static_cast<uint64_t>(i)},
                                            fmt::format("preview_step{}", k));
          z.push_back(torch::randn({spec.in_channels, h, w}, gen, torch::kFloat32));
        }
        step_noise.push_back(torch::stack(z).to(o.device));
      }
      const auto F = [&](const torch::Tensor& x_hat, double s) {
        const auto t = torch::full({x_hat.size(0)}, s, torch::TensorOptions().device(o.device));
        auto out = model::trigflow_forward(*model, x_hat, t, single).to(torch::kFloat32);
        if (o.on_step) o.on_step();
        return out;
      };
      const auto x0 = diffusion::sample_scm(F, x1, step_noise, times, o.sigma_data);
      out.push_back(to_images(x0, spec, o).to(torch::kCPU, torch::kFloat32).clamp(-1, 1));
      continue;
    }
    Velocity v;
    if (guide) {
      v = guided([&](const torch::Tensor& x2, double sigma) { return run(x2, sigma, both); }, o.cfg_scale);
    } else {
      const auto single = first_half(both, n, conditioned, controlled, o);
      v = [&, single](const torch::Tensor& x, double sigma) { return run(x, sigma, single); };
    }
    auto x0 = sample_flow(v, x1, o.steps, o.flow_shift, o.sampler);
    auto images = to_images(x0, spec, o).to(torch::kCPU, torch::kFloat32).clamp(-1, 1);
    if (controlled) images = torch::stack({maps, images}, 1).reshape({2 * n, 3, images.size(2), images.size(3)});
    out.push_back(images);
  }
  return out;
}

torch::Tensor preview_controls(const PreviewOptions& o, int64_t n, int64_t height, int64_t width) {
  auto maps = torch::empty({n, 3, height, width}, torch::kFloat32);
  for (int64_t i = 0; i < n; ++i) {
    const auto& path = o.control_images[static_cast<size_t>(i) % o.control_images.size()];
    const auto d = data::decode_to_bucket(path, static_cast<int>(height), static_cast<int>(width), false, o.control_decode);
    if (!d.ok()) {
      throw std::runtime_error(fmt::format("preview control image '{}': {}: {}", path, data::reason_name(d.bad), d.detail));
    }
    // A scribble's thickness: the config's, else the pipeline's default 2.
    const int thickness = o.control_maps.thickness < 0 ? 2 : o.control_maps.thickness;
    const cv::Mat map = o.control_maps.kind == data::ControlKind::none ? d.rgb
                                                                       : data::control_map(d.rgb, o.control_maps, thickness);
    data::to_chw_normalized(map, maps[i].data_ptr<float>());
  }
  return maps;
}

void write_grid_png(const torch::Tensor& images, const std::string& path, int64_t cols) {
  const int64_t n = images.size(0), h = images.size(2), w = images.size(3), gap = 2;
  if (cols <= 0) cols = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int64_t rows = (n + cols - 1) / cols;
  auto grid = torch::full({rows * h + (rows - 1) * gap, cols * w + (cols - 1) * gap, 3}, 255, torch::kUInt8);
  const auto u8 = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch::kUInt8).permute({0, 2, 3, 1});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / cols, c = i % cols;
    grid.narrow(0, r * (h + gap), h).narrow(1, c * (w + gap), w).copy_(u8[i]);
  }
  grid = grid.flip({2}).contiguous();  // RGB -> OpenCV's BGR
  const cv::Mat mat(static_cast<int>(grid.size(0)), static_cast<int>(grid.size(1)), CV_8UC3, grid.data_ptr());
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::string tmp = path + ".tmp.png";
  if (!cv::imwrite(tmp, mat)) throw std::runtime_error(fmt::format("cannot write preview '{}'", path));
  std::filesystem::rename(tmp, path);
}

std::vector<std::string> render_previews(model::SanaMS& model, const std::vector<PreviewBucket>& buckets,
                                         const PreviewOptions& options, const std::string& dir,
                                         const std::string& stem) {
  const auto grids = sample_previews(model, buckets, options);
  std::vector<std::string> paths;
  for (size_t b = 0; b < buckets.size(); ++b) {
    paths.push_back((std::filesystem::path(dir) /
                     fmt::format("{}_{}x{}.png", stem, buckets[b].height, buckets[b].width))
                        .string());
    // A ControlNet's grid: a row per sample, its control map beside it.
    const bool controlled = model->spec().control_blocks > 0 && !options.control_images.empty();
    write_grid_png(grids[b], paths.back(), controlled ? 2 : 0);
  }
  return paths;
}

}  // namespace sana::train
