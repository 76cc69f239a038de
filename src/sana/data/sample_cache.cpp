#include "sana/data/sample_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sana/util/error.h"

namespace sana::data {

namespace {

enum : uint8_t { kEmpty = 0, kWriting = 1, kReady = 2 };

constexpr uint64_t kAlign = 64;
uint64_t aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t slot_bytes(const std::pair<int, int>& hw) {
  return static_cast<uint64_t>(hw.first) * static_cast<uint64_t>(hw.second) * 3;
}

}  // namespace

std::string size_text(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= (1ull << 30) ? fmt::format("{:.2f} GiB", b / (1ull << 30)) : fmt::format("{:.1f} MiB", b / (1ull << 20));
}

uint64_t SampleCache::bytes_needed(const Shape& shape) {
  uint64_t total = aligned(shape.bucket_of.size());
  for (uint16_t b : shape.bucket_of) total += aligned(slot_bytes(shape.bucket_hw.at(b)));
  return total;
}

SampleCache::SampleCache(const std::string& path, const Shape& shape)
    : path_(path), bucket_of_(shape.bucket_of), bucket_hw_(shape.bucket_hw), bytes_(bytes_needed(shape)) {
  offsets_.reserve(bucket_of_.size());
  uint64_t at = aligned(bucket_of_.size());
  for (uint16_t b : bucket_of_) {
    offsets_.push_back(at);
    at += aligned(slot_bytes(bucket_hw_.at(b)));
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) throw RunError(fmt::format("data.cache: cannot open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  const bool fresh = ::fstat(fd, &st) == 0 && st.st_size == 0;
  // Reserving the space now turns "no room" into this error instead of a SIGBUS mid-run.
  const int err = fresh && bytes_ > 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes_)) : 0;
  if (err != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    throw UsageError(fmt::format(
        "data.cache: cannot reserve {} for {} decoded samples in {}: {}; give it more room (a container's "
        "shared memory: docker run --shm-size), lower data.image_size, or set data.cache: none",
        size_text(bytes_), bucket_of_.size(), path, std::strerror(err)));
  }
  void* map = bytes_ == 0 ? nullptr : ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw RunError(fmt::format("data.cache: cannot map {}: {}", path, std::strerror(errno)));
  base_ = static_cast<uint8_t*>(map);
}

SampleCache::~SampleCache() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

cv::Mat SampleCache::get(uint32_t id, int h, int w) const {
  if (id >= offsets_.size() || bucket_hw_[bucket_of_[id]] != std::make_pair(h, w) ||
      __atomic_load_n(base_ + id, __ATOMIC_ACQUIRE) != kReady) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  hits_.fetch_add(1, std::memory_order_relaxed);
  return cv::Mat(h, w, CV_8UC3, base_ + offsets_[id]);
}

void SampleCache::put(uint32_t id, const cv::Mat& rgb) {
  if (id >= offsets_.size() || rgb.type() != CV_8UC3) return;
  if (bucket_hw_[bucket_of_[id]] != std::make_pair(rgb.rows, rgb.cols)) return;  // a substitute from another bucket
  uint8_t expected = kEmpty;
  if (!__atomic_compare_exchange_n(base_ + id, &expected, kWriting, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    return;  // ready already, or another writer has it
  }
  cv::Mat slot(rgb.rows, rgb.cols, CV_8UC3, base_ + offsets_[id]);
  rgb.copyTo(slot);
  __atomic_store_n(base_ + id, kReady, __ATOMIC_RELEASE);
}

void SampleCache::unlink() const { ::unlink(path_.c_str()); }

SampleCache::Shape cache_shape(const Dataset& dataset) {
  SampleCache::Shape shape{dataset.bucket_of(), {}};
  for (int k = 0; k < dataset.buckets().size(); ++k) {
    const Bucket& b = dataset.buckets().bucket(k);
    shape.bucket_hw.emplace_back(b.height, b.width);
  }
  return shape;
}

}  // namespace sana::data
