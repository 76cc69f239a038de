#include "sana/data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "sana/data/index_builder.h"
#include "sana/util/hash.h"

namespace sana::data {

std::vector<BucketTable> bucket_tables_for(const config::Config& cfg) {
  const auto& d = cfg.data;
  std::vector<int64_t> sizes = {d.image_size};
  for (int64_t s : d.multi_scale_sizes) {
    if (std::find(sizes.begin(), sizes.end(), s) == sizes.end()) sizes.push_back(s);
  }
  std::vector<BucketTable> tables;
  for (int64_t s : sizes) {
    const int base = static_cast<int>(s);
    if (!cfg.model.multi_scale) {
      tables.push_back(BucketTable::square(base));
    } else if (d.aspect_ratio_type == "generated") {
      tables.push_back(BucketTable::generated(base, static_cast<int>(d.bucket_step)));
    } else {
      tables.push_back(BucketTable::upstream(fmt::format("ASPECT_RATIO_{}", base)));
    }
  }
  return tables;
}

BucketSet bucket_set_for(const config::Config& cfg) {
  return BucketSet(bucket_tables_for(cfg), parse_scale_rule(cfg.data.multi_scale_rule));
}

Dataset Dataset::open(const config::Config& cfg, const IndexBuildOptions& options) {
  const std::string cache = (std::filesystem::path(cfg.work_dir) / "index").string();
  const std::string path = ensure_index(cfg.data.data_dir, cache, options);
  auto index = std::make_unique<DatasetIndex>(DatasetIndex::open(path));
  return Dataset(std::move(index), bucket_set_for(cfg), cfg);
}

Dataset::Dataset(std::unique_ptr<DatasetIndex> index, BucketSet buckets, const config::Config& cfg)
    : index_(std::move(index)),
      buckets_(std::move(buckets)),
      global_batch_(cfg.train.global_batch_size),
      seed_(static_cast<uint64_t>(cfg.train.seed)),
      tail_(cfg.data.tail) {
  const uint64_t n = index_->size();
  bucket_of_.resize(n);
  std::vector<int64_t> count(static_cast<size_t>(buckets_.size()), 0);
  bool unknown = false;
  for (uint64_t i = 0; i < n; ++i) {
    const IndexRecord& r = index_->record(i);
    if (r.width == 0 || r.height == 0 || (r.flags & kSizeUnknown) != 0) {
      unknown = true;
      continue;
    }
    bucket_of_[i] = static_cast<uint16_t>(
        buckets_.assign(static_cast<int>(r.height), static_cast<int>(r.width)));
    ++count[bucket_of_[i]];
  }
  if (unknown) {
    // A sample whose size is unknown (an unreadable file) goes to the most common bucket:
    // the loader will substitute it, and there substitutes are plentiful.
    const auto common = static_cast<uint16_t>(std::max_element(count.begin(), count.end()) -
                                              count.begin());
    for (uint64_t i = 0; i < n; ++i) {
      const IndexRecord& r = index_->record(i);
      if (r.width == 0 || r.height == 0 || (r.flags & kSizeUnknown) != 0) bucket_of_[i] = common;
    }
  }
}

EpochPlan Dataset::plan(int64_t epoch) const {
  return EpochPlan::build(bucket_of_, buckets_.size(), global_batch_, seed_, epoch, tail_);
}

std::string Dataset::fingerprint() const {
  std::string rule;
  for (int b = 0; b < buckets_.size(); ++b) rule += buckets_.describe(b) + ";";
  return fmt::format("{}/{}", index_->fingerprint(), hash_hex(rule));
}

}  // namespace sana::data
