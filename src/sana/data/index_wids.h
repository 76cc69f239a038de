// Upstream Sana's WebDataset layout (SanaWebDataset / SanaWebDatasetMS) as an index source:
// `<data_dir>/wids-meta.json` lists uncompressed tar shards; a sample is the members that
// share a key: `<key>.json` ({"prompt", "width", "height", ...}), the image
// (`<key>.png|.jpg|...`) and, for data.load_vae_feat, the latent `<key>.npy`. Text
// features (data.load_text_feat) are `<key>.npz`: a member of the shard, else a file beside
// wids-meta.json, else relative to the working directory (where upstream looks). Each
// sample's metadata (version, CLIP scores, further captions) comes from its .json and the
// files beside its shard (data/sample_meta.h). No torch.
#pragma once

#include <memory>
#include <string>

#include "sana/data/index_sources.h"
#include "sana/data/sample_meta.h"

namespace sana::data {

// A folder holding wids-meta.json, a wids-meta.json file (any JSON object with a
// "shardlist"), or one .tar shard; nullptr when `src` is none of these. `captions`: the
// files beside each shard to read.
std::unique_ptr<RowSource> open_wids_source(const std::string& src, const CaptionSources& captions = {});

}  // namespace sana::data
