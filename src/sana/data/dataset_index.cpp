#include "sana/data/dataset_index.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace sana::data {

DatasetIndex DatasetIndex::open(const std::string& path) {
  DatasetIndex idx;
  idx.file_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw IndexError(fmt::format("cannot open dataset index '{}': {}", path, std::strerror(errno)));
  }
  struct stat st {};
  fstat(fd, &st);
  const auto size = static_cast<uint64_t>(st.st_size);
  const std::string rebuild = "rebuild it with 'sana-train index --input SRC --output FILE'";
  if (size < sizeof(IndexHeader)) {
    ::close(fd);
    throw IndexError(fmt::format("'{}' is not a sana-train dataset index ({} bytes, shorter than "
                                 "its header); {}",
                                 path, size, rebuild));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    throw IndexError(fmt::format("cannot map dataset index '{}': {}", path, std::strerror(errno)));
  }
  idx.map_ = map;
  idx.map_size_ = size;
  const auto* h = static_cast<const IndexHeader*>(map);
  if (std::memcmp(h->magic, kIndexMagic, sizeof kIndexMagic) != 0) {
    throw IndexError(fmt::format("'{}' is not a sana-train dataset index (wrong magic); {}", path,
                                 rebuild));
  }
  if (h->version != kIndexVersion || h->record_size != sizeof(IndexRecord)) {
    throw IndexError(fmt::format("'{}' is a dataset index of format version {} (record size {}); "
                                 "this sana-train reads version {}; {}",
                                 path, h->version, h->record_size, kIndexVersion, rebuild));
  }
  // Compared by subtraction: a damaged header must not overflow its way past the checks.
  const bool counts_fit = h->count <= (size - sizeof(IndexHeader)) / sizeof(IndexRecord);
  if (h->records_offset != sizeof(IndexHeader) || !counts_fit ||
      h->blob_offset != sizeof(IndexHeader) + h->count * sizeof(IndexRecord) ||
      h->blob_offset > size || h->blob_size != size - h->blob_offset) {
    throw IndexError(fmt::format(
        "dataset index '{}' is truncated or damaged: {} bytes on disk, {} expected for {} "
        "records; {}",
        path, size, h->blob_offset + h->blob_size, h->count, rebuild));
  }
  idx.header_ = h;
  idx.records_ = reinterpret_cast<const IndexRecord*>(static_cast<const char*>(map) + h->records_offset);
  idx.blob_ = static_cast<const char*>(map) + h->blob_offset;
  return idx;
}

DatasetIndex::~DatasetIndex() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

DatasetIndex::DatasetIndex(DatasetIndex&& o) noexcept { *this = std::move(o); }

DatasetIndex& DatasetIndex::operator=(DatasetIndex&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) munmap(map_, map_size_);
    file_ = std::move(o.file_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    header_ = std::exchange(o.header_, nullptr);
    records_ = std::exchange(o.records_, nullptr);
    blob_ = std::exchange(o.blob_, nullptr);
  }
  return *this;
}

SampleText DatasetIndex::text(uint64_t i) const {
  const IndexRecord& r = records_[i];
  const uint64_t total = uint64_t{r.path_len} + r.caption_len + r.latent_len + r.text_feat_len + r.meta_len;
  if (r.offset > header_->blob_size || total > header_->blob_size - r.offset) {
    throw IndexError(fmt::format("dataset index '{}' is damaged: record {} points outside its "
                                 "string blob; rebuild it with 'sana-train index'",
                                 file_, i));
  }
  const char* p = blob_ + r.offset;
  SampleText t;
  t.path = {p, r.path_len};
  p += r.path_len;
  t.caption = {p, r.caption_len};
  p += r.caption_len;
  t.latent = {p, r.latent_len};
  p += r.latent_len;
  t.text_feat = {p, r.text_feat_len};
  p += r.text_feat_len;
  t.meta = {p, r.meta_len};
  return t;
}

std::string DatasetIndex::fingerprint() const {
  return header_ ? fmt::format("{:016x}", header_->content_hash) : "empty";
}

}  // namespace sana::data
