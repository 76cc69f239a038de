// Preview images during training: when (train.eval_sampling_steps, train.preview_every_epochs,
// the end of training) and who renders (train.preview_on: "shared" spreads the buckets
// over the ranks, "rank0" lets rank 0 render all while the others wait on its progress).
// Also the one preview setup (config settings, VAE decoder, encoded validation prompts)
// that `sana-train preview` uses too. Previews run the plain module: no collective.
#pragma once

#include <memory>
#include <string>

#include "sana/data/dataset.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/train/previews/sampling.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/report/tensorboard.h"

namespace sana::train {

// What previews are made of, by the keys (train/options/torch_options.h fills it from the config).
struct PreviewSources {
  PreviewOptions sampling;                        // train.preview_*, scheduler.vis_sampler / flow_shift, seed
  std::vector<PreviewBucket> buckets;             // square, tallest and widest of the base size's table
  std::vector<std::string> validation_prompts;    // train.validation_prompts
  bool vae_configured = false;                    // vae.*: the run has a VAE (training may not load it)
  double control_scale = 1.0;                     // controlnet.conditioning_scale
  data::DecodeOptions control_decode;             // how control images decode (the data.* decode keys)
  std::vector<std::string> validation_control_images;  // controlnet.validation_scribble_maps
  data::ControlMapOptions control_maps;           // the control maps the dataset's samples make
};

// When previews are due and who renders them (train/options/torch_options.h fills it).
struct PreviewPolicy {
  bool visualize = false;             // train.visualize
  int64_t eval_sampling_steps = 0;    // train.eval_sampling_steps: every N steps (0: never)
  int64_t preview_every_epochs = 0;   // train.preview_every_epochs (0: never)
  bool rank0_renders_all = false;     // train.preview_on: rank0 (else shared over the ranks)
  std::string work_dir;               // the grids go to work_dir/previews
  bool tensorboard = false;           // train.report_to: tensorboard (rank 0 publishes the grids)
};

// The preview options on `device`: decoding through the VAE when it can, the validation
// prompts encoded once for a caption model, a ControlNet's control images (the validation
// maps, else the maps of `dataset`'s first samples when there is one); warnings say what is
// missing.
PreviewOptions preview_setup(const PreviewSources& sources, torch::Device device, const Encoders& encoders,
                             const model::ModelSpec& spec, const data::Dataset* dataset = nullptr);

// Why previews are due after the step that made `global_step` steps, or "" (the end of
// training renders separately).
std::string preview_reason(const PreviewPolicy& p, int64_t global_step, int64_t total_steps, bool epoch_end,
                           int64_t epoch);

class Previews {
 public:
  Previews(PreviewPolicy policy, const PreviewSources& sources, dist::Runtime& rt, model::SanaMS& model,
           const Encoders& encoders, const data::Dataset& dataset);
  // Why previews are due after this step (preview_reason under this run's policy), or "".
  std::string due(int64_t global_step, int64_t total_steps, bool epoch_end, int64_t epoch) const {
    return preview_reason(policy_, global_step, total_steps, epoch_end, epoch);
  }
  void maybe_render(int64_t global_step, int64_t total_steps, bool epoch_end, int64_t epoch);
  // Every rank calls it at the same step.
  void render(int64_t global_step, const std::string& why);
  // Rank 0: the grids rendered since (its own at once, the other ranks' once their files
  // are in work_dir/previews) as TensorBoard images "preview/<H>x<W>" at their step.
  void publish(EventWriter* events);

 private:
  struct Grid {
    int64_t step;
    std::string tag, path;
  };
  std::vector<Grid> unpublished_;
  PreviewPolicy policy_;
  dist::Runtime& rt_;
  model::SanaMS& model_;
  PreviewOptions options_;
  std::vector<PreviewBucket> buckets_;
};

}  // namespace sana::train
