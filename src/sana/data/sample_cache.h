// The decoded-sample cache (data.cache: memory): each sample's decoded, resized and
// cropped 8-bit RGB bucket image, before the per-epoch flip, kept after its first decode
// so later epochs skip reading and decoding the file. Flips are applied when a sample is
// copied into its batch, so a cached run trains on exactly the bytes an uncached run does.
//
// One file of slots, memory-mapped and shared by every process that opens the same path:
// the ranks on one node open it in shared memory (/dev/shm), so a sample decoded by one
// rank in epoch 1 serves whichever rank draws it later (the epoch plan deals samples to
// ranks anew every epoch; a cache per process would miss half of them in epoch 2 with 2
// ranks). Every sample has a fixed slot sized for its own bucket (offsets from the
// index's bucket assignment), so the size needed is known, and checked, before training.
// A slot's state byte goes empty -> writing -> ready with atomic operations; a reader uses
// only ready slots and a writer that finds a slot taken leaves it, so nobody ever waits.
// data.cache: memory: the trainer removes the file's name once every rank has it open:
// the memory goes back when the last process exits, however it exits.
// data.cache: disk: the file is kept (in data.cache_dir, named by a key of the data and
// the decode settings: a change makes a new file) and later runs and
// `check-data --fill-cache` reuse it. Each slot carries a checksum, so a slot that did not
// reach the disk whole is decoded again; a slot left mid-write by a killed process is
// emptied by the next run that opens the file alone (a shared flock marks the users).
// No torch.
#pragma once

#include <opencv2/core.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/data/decode.h"

namespace sana::data {

class SampleCache {
 public:
  // Slot geometry for samples whose bucket (h x w pixels) is bucket_hw[bucket_of[id]].
  struct Shape {
    std::vector<uint16_t> bucket_of;                 // per sample
    std::vector<std::pair<int, int>> bucket_hw;      // per bucket: height, width
  };
  // Bytes the file takes for `shape` (slots, state bytes and alignment).
  static uint64_t bytes_needed(const Shape& shape);
  // Opens `path`, creating it at bytes_needed() and reserving its space (posix_fallocate)
  // when it is new or not a cache of `key`; throws sana::UsageError naming the path and
  // the size when it cannot (no space: e.g. a small /dev/shm). Any number of processes may
  // open one path at once. `kept`: a disk cache (checksums, the lock, repair on open).
  SampleCache(const std::string& path, const Shape& shape, uint64_t key = 0, bool kept = false);
  ~SampleCache();
  SampleCache(const SampleCache&) = delete;
  SampleCache& operator=(const SampleCache&) = delete;

  // Sample `id`'s cached image when it is ready and its slot is h x w; else an empty Mat.
  // The Mat points into the mapping and stays valid for the cache's life.
  cv::Mat get(uint32_t id, int h, int w) const;
  // Stores `rgb` (CV_8UC3, h x w) for `id` unless its slot is another size or another
  // process or thread has taken it.
  void put(uint32_t id, const cv::Mat& rgb);
  // Removes the file's name (the mapping stays until every process closes it).
  void unlink() const;

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  size_t samples() const { return offsets_.size(); }
  // This process's lookups since it opened the cache.
  int64_t hits() const { return hits_.load(); }
  int64_t misses() const { return misses_.load(); }
  // Samples ready when this process opened the cache (a kept file: from earlier runs).
  int64_t ready_at_open() const { return ready_at_open_; }

 private:
  void create(const std::string& path, uint64_t key, bool start_afresh);
  bool header_matches(uint64_t size, uint64_t key) const;
  uint64_t& checksum(uint32_t id) const;

  std::string path_;
  std::vector<uint64_t> offsets_;               // per sample, from the file's start
  std::vector<uint16_t> bucket_of_;
  std::vector<std::pair<int, int>> bucket_hw_;
  uint64_t bytes_ = 0;
  uint8_t* base_ = nullptr;  // the mapping: header, state bytes, checksums, slots
  bool kept_ = false;
  int fd_ = -1;              // a kept file stays open: its flock marks this process a user
  int64_t ready_at_open_ = 0;
  mutable std::atomic<int64_t> hits_{0}, misses_{0};
};

// "1.23 GiB", or "45.6 MiB" below a GiB.
std::string size_text(uint64_t bytes);

// The slot geometry of `dataset`: every sample at its own bucket's size.
SampleCache::Shape cache_shape(const Dataset& dataset);

// Where data.cache: disk keeps its file, and what the pixels depend on besides the data.
struct DiskCacheOptions {
  std::string dir;                        // data.cache_dir, or work_dir/sample_cache
  DecodeOptions decode;                   // what the pixels depend on (its describe())
};

// data.cache: disk: opens (creating the folder and the file as needed) the kept file for
// the dataset and decode settings, <dir>/samples-<key>.cache; the key covers the index,
// the bucket assignment and every setting the pixels depend on. Throws UsageError naming
// data.cache_dir when the folder cannot be made.
std::shared_ptr<SampleCache> open_disk_cache(const DiskCacheOptions& options, const Dataset& dataset);

}  // namespace sana::data
