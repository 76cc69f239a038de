// DreamBooth's class images (data.class_data_dir; diffusers' train_dreambooth_lora_sana.py
// --with_prior_preservation): the folder the loader pairs every sample with
// (data/loader_options.h, LoaderOptions::prior). When it holds fewer images than
// data.num_class_images, the rest are generated before the first step by the model about
// to be fine-tuned, with the preview sampler and data.class_prompt, square at the base
// size: image k is generated_<k>.png, from noise keyed (train.seed, k), so an interrupted
// generation resumes where it stopped and any process count makes the same files. The
// ranks share the work.
#pragma once

#include <cstdint>
#include <string>

#include "sana/data/dataset.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/train/previews/previews.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/input/shared_dataset.h"

namespace sana::train {

struct ClassImageOptions {
  std::string dir;                 // data.class_data_dir
  std::string prompt;              // data.class_prompt
  int64_t count = 100;             // data.num_class_images
  PreviewSources sampling;         // the preview sampler's keys (its first bucket: the square one)
  SharedDatasetOptions dataset;    // how the folder is indexed (as the training set)
};

// Generates what is missing (collective: rank 0 decides, every rank makes its share), then
// indexes the folder (collective). Throws UsageError when nothing can be written there.
data::Dataset open_class_images(const ClassImageOptions& o, model::SanaMS& model, const Encoders& encoders,
                                dist::Runtime& rt);

// The generated file names still missing in `dir` for `count` class images: the folder's
// other images count first (diffusers' rule), generated_<k>.png make up the rest.
std::vector<int64_t> missing_class_images(const std::string& dir, int64_t count);

}  // namespace sana::train
