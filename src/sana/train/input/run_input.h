// What the run's steps read, as Trainer::start opens it: the training set, the cache of
// its decoded samples, the class images of prior preservation, how a ControlNet's maps are
// made, and the guard that counts the samples that failed to load.
//
// Owns: those parts, opened once per trainer (the guard's counts are checkpointed).
// Never: plans an epoch (the dataset and data.sampler do) or makes a loader (run_epoch).
#pragma once

#include <memory>
#include <optional>

#include "sana/data/control_maps.h"
#include "sana/data/dataset.h"
#include "sana/train/input/data_cache.h"
#include "sana/train/input/data_guards.h"

namespace sana::train {

struct RunInput {
  std::optional<data::Dataset> dataset;  // data.data_dir, indexed and bucketed
  std::shared_ptr<data::SampleCache> cache;  // data.cache (null: none)
  std::optional<data::Dataset> classes;  // data.class_data_dir's class images (none when off)
  data::ControlMapOptions control_maps;  // a ControlNet's (kind none otherwise)
  std::optional<BadSampleGuard> guard;  // data.max_bad_fraction
};

}  // namespace sana::train
