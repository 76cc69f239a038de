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
// The trainer removes the file's name once every rank has it open: the memory goes back
// when the last process exits, however it exits. No torch.
#pragma once

#include <opencv2/core.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "sana/data/dataset.h"

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
  // when it is new; throws sana::RunError naming the path and the size when it cannot
  // (no space: e.g. a small /dev/shm). Any number of processes may open one path at once.
  SampleCache(const std::string& path, const Shape& shape);
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

 private:
  std::string path_;
  std::vector<uint64_t> offsets_;               // per sample, from the file's start
  std::vector<uint16_t> bucket_of_;
  std::vector<std::pair<int, int>> bucket_hw_;
  uint64_t bytes_ = 0;
  uint8_t* base_ = nullptr;  // the mapping; state bytes first
  mutable std::atomic<int64_t> hits_{0}, misses_{0};
};

// "1.23 GiB", or "45.6 MiB" below a GiB.
std::string size_text(uint64_t bytes);

// The slot geometry of `dataset`: every sample at its own bucket's size.
SampleCache::Shape cache_shape(const Dataset& dataset);

}  // namespace sana::data
