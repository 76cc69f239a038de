// A training dataset as the plan sees it: the memory-mapped index of data.data_dir (built
// and cached in work_dir when the sources are not an index), the bucket set from the
// config, and each sample's bucket. Everything a rank needs to compute the epoch plan
// without the network. No torch.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/config/config.h"
#include "sana/data/bucket_members.h"
#include "sana/data/buckets.h"
#include "sana/data/dataset_index.h"
#include "sana/data/epoch_plan.h"
#include "sana/data/index_builder.h"

namespace sana::data {

// The bucket tables a config asks for: upstream's or generated, one per base size, or a
// single square bucket when model.multi_scale is false.
// One table per base size (data.image_size first, then data.multi_scale_sizes).
std::vector<BucketTable> bucket_tables_for(const config::Config& cfg);
BucketSet bucket_set_for(const config::Config& cfg);

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
BatchSpec batch_spec_of(const config::TrainConfig& t);

// A part of an epoch batched with one BatchSpec from `first_step` (data/epoch_plan.h).
struct EpochPart {
  int64_t first_step = 0;
  BatchSpec batch;
};

class Dataset {
 public:
  // Opens (or builds and caches) the index; throws IndexError. `token_cell`: the pixels on
  // a side of one token (VAE downsampling x patch size), needed with train.batch_tokens.
  static Dataset open(const config::Config& cfg, const IndexBuildOptions& options = {}, int64_t token_cell = 0);

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
  const BatchSpec& batch_spec() const { return spec_; }  // the config's
  // The config's plan of `epoch`; or one whose parts were batched otherwise, as a run
  // resumed with another batch size has.
  EpochPlan plan(int64_t epoch) const;
  EpochPlan plan(int64_t epoch, const std::vector<EpochPart>& parts) const;
  // What ranks compare at start-up: the index's content and the bucket assignment rule.
  std::string fingerprint() const;

 private:
  // `bucket_file`: where the bucket assignment is kept (built there when missing).
  Dataset(std::unique_ptr<DatasetIndex> index, BucketSet buckets, const config::Config& cfg,
          const std::string& bucket_folder, const IndexBuildOptions& options, int64_t token_cell);

  std::unique_ptr<DatasetIndex> index_;
  BucketSet buckets_;
  std::shared_ptr<const BucketMembers> members_;
  BatchSpec spec_;
  int64_t token_cell_ = 0;
  uint64_t seed_;
  TailPolicy tail_;
};

}  // namespace sana::data
