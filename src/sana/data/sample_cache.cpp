#include "sana/data/sample_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "sana/util/error.h"

namespace sana::data {

namespace {

enum : uint8_t { kEmpty = 0, kWriting = 1, kReady = 2 };

constexpr uint64_t kAlign = 64;
uint64_t aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t slot_bytes(const std::pair<int, int>& hw) {
  return static_cast<uint64_t>(hw.first) * static_cast<uint64_t>(hw.second) * 3;
}

// The file: a header, a state byte per sample, a checksum per sample, then the slots.
constexpr char kMagic[8] = {'S', 'A', 'N', 'A', 'S', 'M', 'P', '1'};
struct CacheFileHeader {
  char magic[8];
  uint64_t key;
  uint64_t samples;
  uint64_t bytes;
};
constexpr uint64_t kHeaderBytes = 64;
uint64_t states_at() { return kHeaderBytes; }
uint64_t checksums_at(size_t n) { return kHeaderBytes + aligned(n); }
uint64_t slots_at(size_t n) { return checksums_at(n) + aligned(8 * n); }

[[noreturn]] void fail_open(const std::string& path, const char* what, int err) {
  throw RunError(fmt::format("data.cache: cannot {} {}: {}", what, path, std::strerror(err)));
}

// A shared lock on the cache file, for as long as it is open: a run that finds the file
// unlocked (nobody else uses it) may repair it first. The exclusive holder only checks or
// creates the file, so waiting for it is short; still bounded.
bool lock_exclusive_or_shared(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) {
      const int err = errno;
      ::close(fd);
      fail_open(path, "lock (another run has held it for 60 s)", err);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

std::string size_text(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= (1ull << 30) ? fmt::format("{:.2f} GiB", b / (1ull << 30)) : fmt::format("{:.1f} MiB", b / (1ull << 20));
}

uint64_t SampleCache::bytes_needed(const Shape& shape) {
  uint64_t total = slots_at(shape.bucket_of.size());
  for (uint16_t b : shape.bucket_of) total += aligned(slot_bytes(shape.bucket_hw.at(b)));
  return total;
}

SampleCache::SampleCache(const std::string& path, const Shape& shape, uint64_t key, bool kept)
    : path_(path), bucket_of_(shape.bucket_of), bucket_hw_(shape.bucket_hw), bytes_(bytes_needed(shape)),
      kept_(kept) {
  offsets_.reserve(bucket_of_.size());
  uint64_t at = slots_at(bucket_of_.size());
  for (uint16_t b : bucket_of_) {
    offsets_.push_back(at);
    at += aligned(slot_bytes(bucket_hw_.at(b)));
  }
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) fail_open(path, "open", errno);
  const bool alone = kept_ && lock_exclusive_or_shared(fd_, path);
  struct stat st {};
  const uint64_t size = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (!kept_) {
    if (size == 0) create(path, key, /*start_afresh=*/false);  // the node's first rank here
  } else if (!header_matches(size, key)) {
    if (!alone) {
      ::close(fd_);
      throw RunError(fmt::format("data.cache: {} is in use by another run and is not a cache of this data", path));
    }
    create(path, key, /*start_afresh=*/true);
  }
  void* map = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    ::close(fd_);
    fail_open(path, "map", err);
  }
  base_ = static_cast<uint8_t*>(map);
  for (size_t id = 0; id < offsets_.size(); ++id) {
    uint8_t& state = base_[states_at() + id];
    if (alone && state == kWriting) state = kEmpty;  // its writer was killed mid-write
    if (state == kReady) ++ready_at_open_;
  }
  if (kept_ && alone) ::flock(fd_, LOCK_SH);  // others may join now
  if (!kept_) {
    ::close(fd_);
    fd_ = -1;
  }
}

bool SampleCache::header_matches(uint64_t size, uint64_t key) const {
  CacheFileHeader have{};
  return size == bytes_ && ::pread(fd_, &have, sizeof have, 0) == static_cast<ssize_t>(sizeof have) &&
         std::memcmp(have.magic, kMagic, sizeof kMagic) == 0 && have.key == key &&
         have.samples == bucket_of_.size() && have.bytes == bytes_;
}

void SampleCache::create(const std::string& path, uint64_t key, bool start_afresh) {
  // Reserving the space now turns "no room" into this error instead of a SIGBUS mid-run.
  // Only a process that holds the file alone may empty it (start_afresh).
  int err = start_afresh && ::ftruncate(fd_, 0) != 0 ? errno : 0;
  if (err == 0) err = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes_));
  CacheFileHeader h{{}, key, bucket_of_.size(), bytes_};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  if (err == 0 && ::pwrite(fd_, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) err = errno;
  if (err != 0) {
    ::close(fd_);
    ::unlink(path.c_str());
    throw UsageError(fmt::format(
        "data.cache: cannot reserve {} for {} decoded samples in {}: {}; {}, lower data.image_size, or set "
        "data.cache: none",
        size_text(bytes_), bucket_of_.size(), path, std::strerror(err),
        kept_ ? "free space there or point data.cache_dir elsewhere"
              : "give it more room (a container's shared memory: docker run --shm-size)"));
  }
}

SampleCache::~SampleCache() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);  // and with it the lock
}

cv::Mat SampleCache::get(uint32_t id, int h, int w) const {
  uint8_t* state = base_ + states_at() + id;
  if (id >= offsets_.size() || bucket_hw_[bucket_of_[id]] != std::make_pair(h, w) ||
      __atomic_load_n(state, __ATOMIC_ACQUIRE) != kReady) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  const uint64_t n = slot_bytes(bucket_hw_[bucket_of_[id]]);
  if (kept_ && XXH3_64bits(base_ + offsets_[id], n) != checksum(id)) {
    // A kept file whose slot did not reach the disk whole (the machine went down): decode
    // it again, and let the next writer take the slot.
    uint8_t expected = kReady;
    __atomic_compare_exchange_n(state, &expected, kEmpty, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    misses_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  hits_.fetch_add(1, std::memory_order_relaxed);
  return cv::Mat(h, w, CV_8UC3, base_ + offsets_[id]);
}

void SampleCache::put(uint32_t id, const cv::Mat& rgb) {
  if (id >= offsets_.size() || rgb.type() != CV_8UC3) return;
  if (bucket_hw_[bucket_of_[id]] != std::make_pair(rgb.rows, rgb.cols)) return;  // a substitute from another bucket
  uint8_t* state = base_ + states_at() + id;
  uint8_t expected = kEmpty;
  if (!__atomic_compare_exchange_n(state, &expected, kWriting, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    return;  // ready already, or another writer has it
  }
  cv::Mat slot(rgb.rows, rgb.cols, CV_8UC3, base_ + offsets_[id]);
  rgb.copyTo(slot);
  if (kept_) checksum(id) = XXH3_64bits(slot.data, slot_bytes(bucket_hw_[bucket_of_[id]]));
  __atomic_store_n(state, kReady, __ATOMIC_RELEASE);
}

uint64_t& SampleCache::checksum(uint32_t id) const {
  return reinterpret_cast<uint64_t*>(base_ + checksums_at(offsets_.size()))[id];
}

void SampleCache::unlink() const { ::unlink(path_.c_str()); }

SampleCache::Shape cache_shape(const Dataset& dataset) {
  SampleCache::Shape shape{dataset.bucket_vector(), {}};
  for (int k = 0; k < dataset.buckets().size(); ++k) {
    const Bucket& b = dataset.buckets().bucket(k);
    shape.bucket_hw.emplace_back(b.height, b.width);
  }
  return shape;
}

std::shared_ptr<SampleCache> open_disk_cache(const DiskCacheOptions& options, const Dataset& dataset) {
  // What the cached pixels depend on: the files and their buckets (the dataset's
  // fingerprint), the decode settings, and this decoder's cover-and-crop (the format number:
  // raise it when decoding changes what it gives).
  const std::string what = fmt::format("{}|{}|decode 2", dataset.fingerprint(), options.decode.describe());
  const uint64_t key = XXH3_64bits(what.data(), what.size());
  const std::filesystem::path dir(options.dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw UsageError(fmt::format("data.cache_dir {}: cannot create it: {}; point data.cache_dir at a writable local "
                                 "folder", dir.string(), ec.message()), "config error");
  }
  return std::make_shared<SampleCache>((dir / fmt::format("samples-{:016x}.cache", key)).string(),
                                       cache_shape(dataset), key, /*kept=*/true);
}

}  // namespace sana::data
