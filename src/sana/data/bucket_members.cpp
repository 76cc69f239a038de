#include "sana/data/bucket_members.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "sana/util/error.h"

namespace sana::data {

namespace {

constexpr char kMagic[8] = {'S', 'A', 'N', 'A', 'B', 'K', 'T', '1'};

struct MembersFileHeader {
  char magic[8];
  uint64_t key;
  uint64_t samples;
  uint64_t buckets;
  uint64_t unknown;  // samples of unknown size
};
static_assert(sizeof(MembersFileHeader) == 40, "the header is 40 bytes on disk");

uint64_t align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// header | start[buckets + 1] int64 | bucket_of[samples] uint16 (padded to 8) | ids[samples] uint32
uint64_t of_offset(uint64_t buckets) { return sizeof(MembersFileHeader) + 8 * (buckets + 1); }
uint64_t ids_offset(uint64_t samples, uint64_t buckets) { return align8(of_offset(buckets) + 2 * samples); }
uint64_t file_bytes(uint64_t samples, uint64_t buckets) { return ids_offset(samples, buckets) + 4 * samples; }

// Fills the layout at `base` (already sized): buckets, then each bucket's members.
void fill(uint8_t* base, uint64_t key, uint64_t samples, int num_buckets,
          const std::function<uint16_t(uint64_t)>& bucket, const std::function<void(uint64_t)>& progress) {
  const auto nb = static_cast<uint64_t>(num_buckets);
  auto* h = reinterpret_cast<MembersFileHeader*>(base);
  auto* start = reinterpret_cast<int64_t*>(base + sizeof(MembersFileHeader));
  auto* of = reinterpret_cast<uint16_t*>(base + of_offset(nb));
  auto* ids = reinterpret_cast<SampleId*>(base + ids_offset(samples, nb));
  std::vector<int64_t> count(nb, 0);
  bool unknown = false;
  for (uint64_t i = 0; i < samples; ++i) {
    const uint16_t b = bucket(i);
    of[i] = b;
    if (b == BucketMembers::kUnknown) {
      unknown = true;
    } else if (b >= nb) {
      throw std::invalid_argument(fmt::format("bucket id {} out of range", b));
    } else {
      ++count[b];
    }
    if (progress && (i + 1) % (1u << 22) == 0) progress(i + 1);
  }
  uint64_t unknowns = 0;
  if (unknown) {
    const auto common = static_cast<uint16_t>(std::max_element(count.begin(), count.end()) - count.begin());
    for (uint64_t i = 0; i < samples; ++i) {
      if (of[i] == BucketMembers::kUnknown) {
        of[i] = common;
        ++count[common];
        ++unknowns;
      }
    }
  }
  start[0] = 0;
  for (uint64_t b = 0; b < nb; ++b) start[b + 1] = start[b] + count[b];
  std::vector<int64_t> next(start, start + nb);
  for (uint64_t i = 0; i < samples; ++i) ids[next[of[i]]++] = static_cast<SampleId>(i);
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->key = key;
  h->samples = samples;
  h->buckets = nb;
  h->unknown = unknowns;
}

}  // namespace

BucketMembers::BucketMembers(const std::vector<uint16_t>& bucket_of, int num_buckets) {
  if (num_buckets < 1) throw std::invalid_argument("a plan needs at least one bucket");
  buckets_ = num_buckets;
  samples_ = bucket_of.size();
  owned_.resize(file_bytes(samples_, static_cast<uint64_t>(num_buckets)));
  fill(owned_.data(), 0, samples_, num_buckets, [&](uint64_t i) { return bucket_of[i]; }, {});
  point_into(owned_.data());
}

BucketMembers::~BucketMembers() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void BucketMembers::point_into(const uint8_t* base) {
  const auto nb = static_cast<uint64_t>(buckets_);
  start_ = reinterpret_cast<const int64_t*>(base + sizeof(MembersFileHeader));
  of_ = reinterpret_cast<const uint16_t*>(base + of_offset(nb));
  unknown_ = static_cast<int64_t>(reinterpret_cast<const MembersFileHeader*>(base)->unknown);
  ids_ = reinterpret_cast<const SampleId*>(base + ids_offset(samples_, nb));
}

namespace {

// Maps `path` read-only when it is a complete file for (key, samples, buckets); else null.
void* map_existing(const std::string& path, uint64_t key, uint64_t samples, uint64_t buckets, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == bytes) {
    map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  const auto* h = static_cast<const MembersFileHeader*>(map);
  if (std::memcmp(h->magic, kMagic, sizeof kMagic) == 0 && h->key == key && h->samples == samples &&
      h->buckets == buckets) {
    return map;
  }
  ::munmap(map, bytes);
  return nullptr;
}

void build_file(const std::string& path, uint64_t key, uint64_t samples, int num_buckets, size_t bytes,
                const std::function<uint16_t(uint64_t)>& bucket, const std::function<void(uint64_t)>& progress) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw RunError(fmt::format("cannot {} the bucket file '{}' ({} bytes): {}; check the space and permissions of "
                               "work_dir",
                               what, tmp, bytes, std::strerror(err)));
  };
  if (fd < 0) fail("create");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) fail("size");
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) fail("map");
  try {
    fill(static_cast<uint8_t*>(map), key, samples, num_buckets, bucket, progress);
  } catch (...) {
    ::munmap(map, bytes);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  const bool synced = ::msync(map, bytes, MS_SYNC) == 0;
  ::munmap(map, bytes);
  if (!synced || ::fsync(fd) != 0) fail("write");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

}  // namespace

std::shared_ptr<const BucketMembers> BucketMembers::mapped(const std::string& path, uint64_t key, uint64_t samples,
                                                           int num_buckets,
                                                           const std::function<uint16_t(uint64_t)>& bucket,
                                                           const std::function<void(uint64_t)>& progress) {
  if (num_buckets < 1) throw std::invalid_argument("a plan needs at least one bucket");
  const auto nb = static_cast<uint64_t>(num_buckets);
  const auto bytes = static_cast<size_t>(file_bytes(samples, nb));
  void* map = map_existing(path, key, samples, nb, bytes);
  if (map == nullptr) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    build_file(path, key, samples, num_buckets, bytes, bucket, progress);
    map = map_existing(path, key, samples, nb, bytes);
    if (map == nullptr) throw RunError(fmt::format("the bucket file '{}' was replaced while being opened", path));
  }
  std::shared_ptr<BucketMembers> out(new BucketMembers());
  out->buckets_ = num_buckets;
  out->samples_ = samples;
  out->map_ = map;
  out->map_size_ = bytes;
  out->point_into(static_cast<const uint8_t*>(map));
  return out;
}

}  // namespace sana::data
