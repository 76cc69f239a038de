#include "sana/data/dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <cmath>
#include <stdexcept>
#include <filesystem>

#include "sana/data/index_builder.h"
#include "sana/util/hash.h"
#include "sana/util/log.h"

namespace sana::data {

std::vector<BucketTable> bucket_tables_for(const BucketOptions& options) {
  std::vector<int64_t> sizes;
  for (int64_t s : options.base_sizes) {
    if (std::find(sizes.begin(), sizes.end(), s) == sizes.end()) sizes.push_back(s);
  }
  std::vector<BucketTable> tables;
  for (int64_t s : sizes) {
    const int base = static_cast<int>(s);
    if (!options.multi_scale) {
      tables.push_back(BucketTable::square(base));
    } else if (options.aspect_ratio_type == "generated") {
      tables.push_back(BucketTable::generated(base, static_cast<int>(options.bucket_step)));
    } else {
      tables.push_back(BucketTable::upstream(fmt::format("ASPECT_RATIO_{}", base)));
    }
  }
  return tables;
}

BucketSet bucket_set_for(const BucketOptions& options) {
  return BucketSet(bucket_tables_for(options), parse_scale_rule(options.scale_rule));
}

std::string BatchSpec::describe() const {
  return batch_tokens > 0 ? fmt::format("train.batch_tokens {}", batch_tokens)
                          : fmt::format("train.global_batch_size {}", global_batch);
}

namespace {

// The index of the samples `filter` keeps, built from `full` beside it once per filter.
// Throws IndexError when it keeps none.
std::string filtered_index(const std::string& full, const SampleFilter& filter, const DatasetOptions& options,
                           IndexBuildOptions build) {
  const std::string key = DatasetIndex::open(full).fingerprint() + "/" + filter.describe();
  const std::string path =
      (std::filesystem::path(options.index_dir) / fmt::format("kept-{}.sidx", hash_hex(key))).string();
  if (std::filesystem::exists(path)) return path;
  std::map<std::string, uint64_t> dropped;
  uint64_t seen = 0;
  build.keep = [&](const IndexRow& row) {
    ++seen;
    const char* why = filter.drops(row.meta, row.path);
    if (why != nullptr) ++dropped[why];
    return why == nullptr;
  };
  const std::string tmp = path + ".building";
  const auto r = build_index({full}, tmp, build);
  std::string why;
  for (const auto& [k, n] : dropped) why += fmt::format("{}{} dropped {}", why.empty() ? "" : ", ", k, n);
  if (r.rows == 0 && filter.holdout > 0) {
    std::filesystem::remove(tmp);
    throw IndexError(fmt::format("train.eval.fraction {} {} none of the {} samples of {} ({}): give a fraction that "
                                 "holds out some and keeps some, or name held-out samples in train.eval.data_dir",
                                 filter.holdout, filter.held_out ? "holds out" : "leaves", seen,
                                 fmt::join(options.sources, ", "), why));
  }
  if (r.rows == 0) {
    std::filesystem::remove(tmp);
    throw IndexError(fmt::format(
        "the data filters left no sample of {} in {} ({}); upstream's layout keeps the quality in each sample's "
        ".json (\"version\": \"high_quality\") and the prompt's CLIP score in <shard>_prompt_clip_score.json: "
        "check them or relax the filters",
        seen, fmt::join(options.sources, ", "), why));
  }
  std::filesystem::rename(tmp, path);
  log::info("data filters ({}): kept {} of {} samples ({})", filter.describe(), r.rows, seen,
            why.empty() ? "none dropped" : why);
  return path;
}

}  // namespace

Dataset Dataset::open(const DatasetOptions& options, const IndexBuildOptions& build, int64_t token_cell) {
  IndexBuildOptions b = build;
  b.exif_orientation = options.exif_orientation;
  b.captions = options.captions;
  std::string path = ensure_index(options.sources, options.index_dir, b);
  if (options.filter.active()) path = filtered_index(path, options.filter, options, b);
  auto index = std::make_unique<DatasetIndex>(DatasetIndex::open(path));
  return Dataset(std::move(index), options, build, token_cell);
}

Dataset::Dataset(std::unique_ptr<DatasetIndex> index, DatasetOptions options, const IndexBuildOptions& build,
                 int64_t token_cell)
    : index_(std::move(index)),
      buckets_(bucket_set_for(options.buckets)),
      options_(std::move(options)),
      token_cell_(token_cell) {
  const std::string key = fingerprint() + "/" + options_.buckets.scale_rule;
  const auto path = std::filesystem::path(options_.index_dir) / fmt::format("buckets-{}.bin", hash_hex(key));
  const auto& idx = *index_;
  const auto bucket = [&](uint64_t i) -> uint16_t {
    const IndexRecord& r = idx.record(i);
    if (r.width == 0 || r.height == 0 || (r.flags & kSizeUnknown) != 0) return BucketMembers::kUnknown;
    return static_cast<uint16_t>(buckets_.assign(static_cast<int>(r.height), static_cast<int>(r.width)));
  };
  const auto progress = [&](uint64_t done) {
    if (build.progress_every_s > 0) log::info("assigning buckets: {} of {} samples", done, idx.size());
    if (build.on_rows) build.on_rows(done);
  };
  members_ = BucketMembers::mapped(path.string(), hash64(key.data(), key.size()), idx.size(), buckets_.size(), bucket,
                                   progress);
}

std::vector<uint16_t> Dataset::bucket_vector() const {
  std::vector<uint16_t> out(static_cast<size_t>(members_->total()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = members_->bucket_of(i);
  return out;
}

std::vector<int64_t> Dataset::batch_sizes(const BatchSpec& spec) const {
  const auto n = static_cast<size_t>(buckets_.size());
  if (spec.batch_tokens <= 0) return std::vector<int64_t>(n, spec.global_batch);
  if (token_cell_ <= 0) throw std::logic_error("train.batch_tokens needs the dataset opened with the token cell");
  std::vector<int64_t> out;
  for (int b = 0; b < buckets_.size(); ++b) {
    const auto& bucket = buckets_.bucket(b);
    const int64_t tokens = std::max<int64_t>(1, (bucket.height / token_cell_) * (bucket.width / token_cell_));
    out.push_back(std::max<int64_t>(1, std::llround(static_cast<double>(spec.batch_tokens) / tokens)));
  }
  return out;
}

EpochPlan Dataset::plan(int64_t epoch) const { return plan(epoch, {{0, options_.batch}}); }

EpochPlan Dataset::plan(int64_t epoch, const std::vector<EpochPart>& parts) const {
  std::vector<PlanSegment> segments;
  for (const auto& part : parts) segments.push_back({part.first_step, batch_sizes(part.batch)});
  return EpochPlan::build(members_, std::move(segments), options_.seed, epoch, options_.tail);
}

std::string Dataset::fingerprint() const {
  std::string rule;
  for (int b = 0; b < buckets_.size(); ++b) rule += buckets_.describe(b) + ";";
  return fmt::format("{}/{}", index_->fingerprint(), hash_hex(rule));
}

}  // namespace sana::data
