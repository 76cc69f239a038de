// The dataset as every rank of a run opens it (training, prepare-features): rank 0 builds
// the index first, reading every image header once; the others wait for it with a bound
// that only a stalled rank 0 reaches, then all ranks agree on its content.
#pragma once

#include <string>

#include "sana/data/dataset.h"
#include "sana/data/sample_meta.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// What every rank opens (train/options/torch_options.h fills it from the config).
struct SharedDatasetOptions {
  data::DatasetOptions dataset;
  int64_t cell = 1;               // the model's cell: pixels per latent token side (downsample x patch)
  bool caption_features = false;  // data.load_text_feat: captions come precomputed
  data::CaptionChoice captions;   // data.caption_selection_type and its keys
  // The name the ranks wait on while rank 0 indexes: one per dataset a run opens (the
  // training set, train.eval's), or the second would find the first one's work done.
  std::string work = "index";
  // Tests only (TestHooks::index_delay_ms): rank 0's indexing takes this much longer, with
  // progress every 100 ms, so a fault trial can strike while the others wait for the index.
  int64_t index_delay_ms = 0;
};

// Throws IndexError (a config or data problem), Disagreement (ranks see other data) or
// PeerFailure.
data::Dataset open_dataset(const SharedDatasetOptions& o, dist::Runtime& rt);

}  // namespace sana::train
