// Preview images during training: when (train.eval_sampling_steps, train.preview_every_epochs,
// the end of training) and who renders (train.preview_on: "shared" spreads the buckets
// over the ranks, "rank0" lets rank 0 render all while the others wait on its progress).
// Also the one preview setup (config settings, VAE decoder, encoded validation prompts)
// that `sana-train preview` uses too. Previews run the plain module: no collective.
#pragma once

#include <memory>
#include <string>

#include "sana/config/config.h"
#include "sana/data/dataset.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/train/preview_images.h"
#include "sana/train/run_encoders.h"
#include "sana/train/report/tensorboard.h"

namespace sana::train {

// The preview options for this config on `device`: decoding through the VAE when it can,
// the validation prompts encoded once for a caption model, a ControlNet's control images
// (controlnet.validation_scribble_maps, else the maps of `dataset`'s first samples when
// there is one); warnings say what is missing.
PreviewOptions preview_setup(const config::Config& cfg, torch::Device device, const Encoders& encoders,
                             const model::ModelSpec& spec, const data::Dataset* dataset = nullptr);

// Why previews are due after the step that made `global_step` steps, or "" (the end of
// training renders separately).
std::string preview_reason(const config::TrainConfig& t, int64_t global_step, int64_t total_steps, bool epoch_end,
                           int64_t epoch);

class Previews {
 public:
  Previews(const config::Config& cfg, dist::Runtime& rt, model::SanaMS& model, const Encoders& encoders,
           const data::Dataset& dataset);
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
  const config::Config& cfg_;
  dist::Runtime& rt_;
  model::SanaMS& model_;
  PreviewOptions options_;
  std::vector<PreviewBucket> buckets_;
};

}  // namespace sana::train
