// The dataset index: a compact binary file the trainer memory-maps. A 64-byte header,
// fixed-size records (offsets into a string blob, width, height, label, flags), then the
// blob. Opening costs O(1) memory beyond the mapping, and processes on a node share it
// through the page cache. A truncated or foreign file is a clear error. No torch.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sana/util/error.h"

namespace sana::data {

constexpr char kIndexMagic[8] = {'S', 'A', 'N', 'A', 'I', 'D', 'X', '1'};
constexpr uint32_t kIndexVersion = 1;

struct IndexHeader {
  char magic[8];
  uint32_t version;
  uint32_t record_size;
  uint64_t count;
  uint64_t records_offset;
  uint64_t blob_offset;
  uint64_t blob_size;
  uint64_t content_hash;  // xxHash3 of the records and the blob
  uint64_t reserved;
};
static_assert(sizeof(IndexHeader) == 64, "the header is 64 bytes on disk");

enum RecordFlags : uint32_t {
  kHasLabel = 1u << 0,
  kHasLatent = 1u << 1,
  kHasTextFeat = 1u << 2,
  kSizeUnknown = 1u << 3,  // the header could not be read: the loader substitutes it
};

// One sample. Its strings lie back to back in the blob from `offset`: path, caption,
// latent path, text-feature path, metadata (the last three usually empty; the metadata is
// what data/sample_meta.h reads: upstream's quality version, CLIP scores, further captions).
struct IndexRecord {
  uint64_t offset;
  uint32_t caption_len;
  uint16_t path_len;
  uint16_t latent_len;
  uint16_t text_feat_len;
  uint16_t meta_len;  // 0 in indexes written before it existed (the field was reserved)
  uint32_t width;
  uint32_t height;
  int32_t label;  // -1: none
  uint32_t flags;
};
static_assert(sizeof(IndexRecord) == 40, "records are 40 bytes on disk");

// The strings of one record.
struct SampleText {
  std::string_view path;
  std::string_view caption;
  std::string_view latent;
  std::string_view text_feat;
  std::string_view meta;
};

class IndexError : public sana::UsageError {
 public:
  explicit IndexError(const std::string& what) : UsageError(what, "data error") {}
};

class DatasetIndex {
 public:
  // Maps `path`; throws IndexError naming the file and what is wrong with it.
  static DatasetIndex open(const std::string& path);
  DatasetIndex() = default;
  ~DatasetIndex();
  DatasetIndex(DatasetIndex&& other) noexcept;
  DatasetIndex& operator=(DatasetIndex&& other) noexcept;
  DatasetIndex(const DatasetIndex&) = delete;
  DatasetIndex& operator=(const DatasetIndex&) = delete;

  uint64_t size() const { return header_ ? header_->count : 0; }
  const IndexRecord& record(uint64_t i) const { return records_[i]; }
  // Throws IndexError when the record points outside the blob (a damaged file).
  SampleText text(uint64_t i) const;
  // What ranks compare at start-up: the content hash, as hex.
  std::string fingerprint() const;
  const std::string& file() const { return file_; }
  uint64_t file_size() const { return map_size_; }

 private:
  std::string file_;
  void* map_ = nullptr;
  uint64_t map_size_ = 0;
  const IndexHeader* header_ = nullptr;
  const IndexRecord* records_ = nullptr;
  const char* blob_ = nullptr;
};

}  // namespace sana::data
