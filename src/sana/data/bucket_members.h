// Each sample's bucket and each bucket's sample ids, stored contiguously in id order: what
// the epoch plan turns a position in a bucket's order into (member(b, k), O(1)), and where
// the loader draws a bad sample's substitutes from. For a dataset it is a file beside the
// index (work_dir/index/buckets-KEY.bin, 6 bytes a sample) that every process maps: memory
// that the page cache shares, not each process's own, at billions of samples. No torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sana::data {

using SampleId = uint32_t;

class BucketMembers {
 public:
  // In memory; bucket_of[i] is sample i's bucket in [0, num_buckets). Throws std::invalid_argument.
  BucketMembers(const std::vector<uint16_t>& bucket_of, int num_buckets);
  // Mapped from `path`, built there first when it is missing or holds another `key`
  // (written to a temporary file and renamed: processes sharing the folder never see a
  // half-written one). `bucket(i)` is sample i's bucket, or kUnknown for a sample of
  // unknown size, which joins the most common bucket (its substitutes are plentiful
  // there). `progress(done)` is called every few million samples of a build.
  static constexpr uint16_t kUnknown = 0xffff;
  static std::shared_ptr<const BucketMembers> mapped(const std::string& path, uint64_t key, uint64_t samples,
                                                     int num_buckets, const std::function<uint16_t(uint64_t)>& bucket,
                                                     const std::function<void(uint64_t)>& progress = {});
  ~BucketMembers();
  BucketMembers(const BucketMembers&) = delete;
  BucketMembers& operator=(const BucketMembers&) = delete;

  int buckets() const { return buckets_; }
  int64_t total() const { return static_cast<int64_t>(samples_); }
  int64_t count(int b) const { return start_[b + 1] - start_[b]; }
  // The k-th member of bucket b (k < count(b)), in sample-id order.
  SampleId member(int b, int64_t k) const { return ids_[start_[b] + k]; }
  uint16_t bucket_of(uint64_t id) const { return of_[id]; }
  // Samples that were kUnknown (now in the most common bucket).
  int64_t unknown() const { return unknown_; }
  // Whether this came from (or was just written to) a file.
  bool is_mapped() const { return map_ != nullptr; }

 private:
  BucketMembers() = default;
  void point_into(const uint8_t* base);  // start_, of_, ids_ from a file's layout

  int buckets_ = 0;
  uint64_t samples_ = 0;
  int64_t unknown_ = 0;
  const int64_t* start_ = nullptr;  // buckets + 1
  const uint16_t* of_ = nullptr;    // per sample
  const SampleId* ids_ = nullptr;   // per sample, grouped by bucket
  std::vector<uint8_t> owned_;      // the in-memory layout
  void* map_ = nullptr;
  size_t map_size_ = 0;
};

}  // namespace sana::data
