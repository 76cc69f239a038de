// Preview images while training (and `sana-train preview`): samples from the model with
// classifier-free guidance for a few buckets (several aspect ratios) and writes one PNG
// grid per bucket. Deterministic for a seed: image i of bucket b starts from the noise
// keyed (seed, b, i). Runs the plain module with no collective inside, so it can run on
// one rank without touching the others.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "sana/data/control_maps.h"
#include "sana/data/decode.h"
#include "sana/model/sana_ms.h"

namespace sana::train {

struct PreviewOptions {
  int steps = 20;
  double cfg_scale = 4.5;         // 1 = no guidance
  int images = 4;                 // per bucket
  uint64_t seed = 0;
  double flow_shift = 1.0;
  std::string sampler = "flow_euler";  // a SanaMSCM student samples with "scm" whatever it says
  double sigma_data = 0.5;             // scm: scheduler.sigma_data
  double scm_mid = 1.0;                // scm with 2 steps: the intermediate TrigFlow time (0: none)
  torch::Device device = torch::kCPU;
  // Turns model outputs into images in [-1, 1] (a VAE decoder); empty: pixel space, or the
  // first three latent channels stretched to [-1, 1] for a latent model without decoder.
  std::function<torch::Tensor(const torch::Tensor&)> decode;
  // Conditions: class ids (class models; default 0, 1, 2, ...) or caption features [N, L, D]
  // with mask [N, L] (caption models; default: the null caption, i.e. unconditional).
  std::vector<int64_t> classes;
  torch::Tensor caption_features, caption_mask;
  // ControlNet: image i is sampled under the control made from control_images[i % count]
  // at each bucket's size (decoded, resized to cover and centre-cropped as training's
  // images): a map as it is (controlnet.validation_scribble_maps; control_maps.kind none)
  // or a photo's map (the dataset's first samples). None: the base alone samples.
  std::vector<std::string> control_images;
  data::ControlMapOptions control_maps;
  data::DecodeOptions control_decode;
  std::function<torch::Tensor(const torch::Tensor&)> encode;  // the maps through the VAE (empty: pixels)
  double control_scale = 1.0;  // controlnet.conditioning_scale
  // Called after every model evaluation (progress for whoever waits on the previews).
  std::function<void()> on_step;
};

struct PreviewBucket {
  int64_t height = 0, width = 0;  // pixels
};

// Samples `images` images of each bucket; returns them as [N, 3, H, W] in [-1, 1], or for a
// ControlNet with control images [2N, 3, H, W]: each control map followed by its sample.
std::vector<torch::Tensor> sample_previews(model::SanaMS& model, const std::vector<PreviewBucket>& buckets,
                                           const PreviewOptions& options);

// sample_previews, then one PNG per bucket: dir/<stem>_<H>x<W>.png. Returns the paths.
std::vector<std::string> render_previews(model::SanaMS& model, const std::vector<PreviewBucket>& buckets,
                                         const PreviewOptions& options, const std::string& dir,
                                         const std::string& stem);

// A grid of images [N, 3, H, W] in [-1, 1], written as PNG (2-pixel gaps), `cols` images to
// a row (0: a near-square grid).
void write_grid_png(const torch::Tensor& images, const std::string& path, int64_t cols = 0);

// The control maps of `options` for n images at one bucket size: [n, 3, H, W] in [-1, 1].
// Throws std::runtime_error naming a control image that cannot be read.
torch::Tensor preview_controls(const PreviewOptions& options, int64_t n, int64_t height, int64_t width);

}  // namespace sana::train
