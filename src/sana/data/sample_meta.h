// What upstream's WebDataset layout says of a sample beyond its image and caption, as
// SanaWebDatasetMS and its AspectRatioBatchSampler read it: the `version` of the sample's
// .json (data.hq_only), its prompt's CLIP score from <shard>_prompt_clip_score.json
// (data.del_img_clip_thr), and further captions with their CLIP scores from the files
// <shard><suffix>.json beside each shard (data.external_caption_suffixes and
// external_clipscore_suffixes). Read once, at indexing, into each sample's metadata
// (IndexRow::meta, a compact JSON object); the filters drop samples by it and the caption
// choice draws from it, every epoch anew. No torch.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sana/util/random.h"

namespace sana::data {

// The files a JSONL/CSV row names besides its image, kept in the sample's metadata: a
// ControlNet's control image (`control`) and its precomputed latent (`control_latent`), and
// the loss mask (`mask`, train.masked_loss). The metadata holding them ("" for none), and
// the paths a metadata holds ("" for none).
std::string meta_with_files(const std::string& control, const std::string& control_latent, const std::string& mask);
std::string control_image(std::string_view meta);
std::string control_latent(std::string_view meta);
std::string mask_image(std::string_view meta);

// The files beside each shard that indexing reads (so part of the index's cache key).
struct CaptionSources {
  std::vector<std::string> caption_suffixes;    // data.external_caption_suffixes
  std::vector<std::string> clipscore_suffixes;  // data.external_clipscore_suffixes
  // Captions kept besides the scored ones: data.caption_proportion's names.
  std::vector<std::string> names;
  bool any() const { return !caption_suffixes.empty() || !clipscore_suffixes.empty() || !names.empty(); }
  std::string describe() const;  // "" when there is none
};

// Upstream's sampler filters, applied to the index once (a filtered index beside it), and
// the held-out share of train.eval.fraction: a sample is held out when a hash of (seed, its
// path) falls below the fraction, the same on every machine and at every world size.
struct SampleFilter {
  bool hq_only = false;         // data.hq_only: only samples whose .json says version "high_quality"
  double min_clip_score = 0.0;  // data.del_img_clip_thr: the prompt's CLIP score at least this
  double holdout = 0.0;         // train.eval.fraction: this share of the samples is held out
  uint64_t holdout_seed = 0;    // train.seed
  bool held_out = false;        // keep the held-out samples (train.eval's set), not the others (training's)
  bool active() const { return hq_only || min_clip_score > 0 || holdout > 0; }
  std::string describe() const;
  // The key that drops the sample at `path` with metadata `meta`, or nullptr to keep it.
  const char* drops(std::string_view meta, std::string_view path = {}) const;
};

enum class CaptionSelection { clipscore, proportion };

// Which caption a sample trains on (data.caption_selection_type and its keys).
struct CaptionChoice {
  CaptionSelection type = CaptionSelection::clipscore;
  double clip_thr = 0.0;     // clipscore: candidates scoring at least this
  double temperature = 1.0;  // clipscore: weights score^(1/max(temperature, 0.01))
  std::vector<std::pair<std::string, double>> proportion{{"prompt", 1.0}};  // proportion: name, weight
  // clipscore: whether the index was built with CLIP-score files (data.external_clipscore_suffixes);
  // without them every sample trains on its prompt.
  bool scored = true;
  // Whether a draw can give anything but the prompt: false skips reading the metadata.
  bool draws() const;
  // Always the sample's own "prompt" (what prepare-features encodes).
  static CaptionChoice prompt_only() { return {CaptionSelection::proportion, 0.0, 1.0, {{"prompt", 1.0}}}; }
  // The caption text: `prompt` (the sample's "prompt") or one of `meta`'s captions, drawn
  // with `rng` as upstream's weighted_sample_clipscore / weighted_sample_fix_prob draw it.
  std::string choose(std::string_view prompt, std::string_view meta, util::RandomStream& rng) const;
};

// The files beside one shard, loaded once for all its samples (index_wids.cpp). Throws
// IndexError naming a file that is not JSON or a score that is not a number.
class ShardSidecars {
 public:
  ShardSidecars(const std::string& shard, const CaptionSources& sources);
  // The metadata of sample `key` whose .json is `info`; "" when there is nothing to keep.
  std::string meta_for(const std::string& key, const nlohmann::json& info) const;

 private:
  struct File {
    std::string path;
    nlohmann::ordered_json json;  // in file order: upstream's tie-breaks follow it
    bool present = false;
  };
  static File load(const std::string& path);

  CaptionSources sources_;
  File prompt_clip_;
  std::vector<File> captions_, clipscores_;
};

}  // namespace sana::data
