// A training dataset as the plan sees it: the memory-mapped index of its sources (built
// and cached in the index folder when the sources are not an index), the bucket set, and
// each sample's bucket. Everything a rank needs to compute the epoch plan
// without the network. No torch.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/data/bucket_members.h"
#include "sana/data/buckets.h"
#include "sana/data/dataset_index.h"
#include "sana/data/epoch_plan.h"
#include "sana/data/index_builder.h"
#include "sana/data/sample_meta.h"

namespace sana::data {

// Which buckets a run's images fall into (data.image_size, data.multi_scale_sizes,
// data.aspect_ratio_type, data.bucket_step, data.multi_scale_rule, model.multi_scale).
struct BucketOptions {
  std::vector<int64_t> base_sizes = {512};  // one table per base size, the first the main one
  bool multi_scale = true;                  // false: one square bucket per base size
  std::string aspect_ratio_type = "ASPECT_RATIO_512";  // "generated": tables in steps of bucket_step
  int64_t bucket_step = 32;
  std::string scale_rule = "largest_fitting";  // which base size a sample takes
};

// The bucket tables the options ask for: upstream's or generated, one per distinct base
// size in order, or a single square bucket each without multi_scale.
std::vector<BucketTable> bucket_tables_for(const BucketOptions& options);
BucketSet bucket_set_for(const BucketOptions& options);

// How a step's global batch is sized: train.global_batch_size samples, or with
// train.batch_tokens > 0 that many tokens, each bucket's batch being batch_tokens / its
// tokens per sample (rounded, at least 1).
struct BatchSpec {
  int64_t global_batch = 0;
  int64_t batch_tokens = 0;
  bool operator==(const BatchSpec& o) const { return global_batch == o.global_batch && batch_tokens == o.batch_tokens; }
  bool operator!=(const BatchSpec& o) const { return !(*this == o); }
  std::string describe() const;  // "train.global_batch_size 8" or "train.batch_tokens 4096"
};

// What a dataset is opened with; the run's values come from train/options/core_options.h.
struct DatasetOptions {
  std::vector<std::string> sources;  // data.data_dir: folders, metadata files or indexes
  std::string index_dir = "index";   // where a built index and the bucket assignment are kept
  BucketOptions buckets;
  BatchSpec batch;                   // the run's batch (a resumed epoch may re-batch)
  uint64_t seed = 0;                 // train.seed: the plan's permutations
  TailPolicy tail = TailPolicy::drop;  // data.tail
  bool distributed_sampler = false;  // data.sampler: distributed (make_epoch_plan)
  double max_untrained_fraction = 0.05;  // data.max_untrained_fraction (check_plan_coverage)
  bool exif_orientation = false;  // data.exif_orientation: header sizes as decoded with it applied
  CaptionSources captions;        // files beside wids shards read at indexing (data/sample_meta.h)
  SampleFilter filter;            // data.hq_only, data.del_img_clip_thr: samples left out
};

// A part of an epoch batched with one BatchSpec from `first_step` (data/epoch_plan.h).
struct EpochPart {
  int64_t first_step = 0;
  BatchSpec batch;
};

class Dataset {
 public:
  // Opens (or builds and caches) the index, and with a filter the index of the samples it
  // keeps (cached beside it); throws IndexError. `token_cell`: the pixels on
  // a side of one token (VAE downsampling x patch size), needed with train.batch_tokens.
  static Dataset open(const DatasetOptions& options, const IndexBuildOptions& build = {}, int64_t token_cell = 0);

  const DatasetIndex& index() const { return *index_; }
  const BucketSet& buckets() const { return buckets_; }
  uint16_t bucket_of(uint64_t id) const { return members_->bucket_of(id); }
  // Every sample's bucket (O(samples) memory: the sample cache's layout).
  std::vector<uint16_t> bucket_vector() const;
  const BucketMembers& members() const { return *members_; }
  std::shared_ptr<const BucketMembers> members_ptr() const { return members_; }
  // Samples whose size was unreadable at indexing (trained only through substitutes).
  int64_t unreadable() const { return members_->unknown(); }
  // The global batch of each bucket.
  std::vector<int64_t> batch_sizes(const BatchSpec& spec) const;
  const BatchSpec& batch_spec() const { return options_.batch; }  // the run's
  const DatasetOptions& options() const { return options_; }
  // The config's plan of `epoch`; or one whose parts were batched otherwise, as a run
  // resumed with another batch size has.
  EpochPlan plan(int64_t epoch) const;
  EpochPlan plan(int64_t epoch, const std::vector<EpochPart>& parts) const;
  // What ranks compare at start-up: the index's content and the bucket assignment rule.
  std::string fingerprint() const;

 private:
  // `bucket_file`: where the bucket assignment is kept (built there when missing).
  Dataset(std::unique_ptr<DatasetIndex> index, DatasetOptions options, const IndexBuildOptions& build,
          int64_t token_cell);

  std::unique_ptr<DatasetIndex> index_;
  BucketSet buckets_;
  std::shared_ptr<const BucketMembers> members_;
  DatasetOptions options_;
  int64_t token_cell_ = 0;
};

}  // namespace sana::data
