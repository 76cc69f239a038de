// A training dataset as the plan sees it: the memory-mapped index of data.data_dir (built
// and cached in work_dir when the sources are not an index), the bucket set from the
// config, and each sample's bucket. Everything a rank needs to compute the epoch plan
// without the network. No torch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sana/config/config.h"
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

class Dataset {
 public:
  // Opens (or builds and caches) the index; throws IndexError.
  static Dataset open(const config::Config& cfg, const IndexBuildOptions& options = {});

  const DatasetIndex& index() const { return *index_; }
  const BucketSet& buckets() const { return buckets_; }
  const std::vector<uint16_t>& bucket_of() const { return bucket_of_; }
  EpochPlan plan(int64_t epoch) const;
  // What ranks compare at start-up: the index's content and the bucket assignment rule.
  std::string fingerprint() const;

 private:
  Dataset(std::unique_ptr<DatasetIndex> index, BucketSet buckets, const config::Config& cfg);

  std::unique_ptr<DatasetIndex> index_;
  BucketSet buckets_;
  std::vector<uint16_t> bucket_of_;
  int64_t global_batch_;
  uint64_t seed_;
  TailPolicy tail_;
};

}  // namespace sana::data
