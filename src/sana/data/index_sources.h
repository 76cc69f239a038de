// The sources a dataset index is built from, read as rows: image folders (recursive;
// captions and labels from sidecar .txt/.json files), JSONL or CSV metadata files, tar
// shards in upstream Sana's WebDataset layout (index_wids.h), and existing indexes. Each yields its rows in a fixed order whatever the file system. No torch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sana/data/sample_meta.h"

namespace sana::data {

// One sample as its source describes it; a width or height of 0 is read from the image.
struct IndexRow {
  std::string path, caption, latent, text_feat;
  uint32_t width = 0, height = 0;
  int32_t label = -1;
  std::string meta;  // upstream's per-sample metadata as data/sample_meta.h writes it; "" for none
};

class RowSource {
 public:
  virtual ~RowSource() = default;
  // Fills `row` with the next row; false at the end. Throws IndexError naming the file
  // (and line) that cannot be read.
  virtual bool next(IndexRow& row) = 0;
};

// A folder (of images, or holding upstream Sana's wids-meta.json), a .jsonl/.json or .csv
// metadata file, a wids-meta.json or .tar shard (index_wids.h), or a dataset index; throws
// IndexError when `src` is missing or none of these. `captions`: what wids shards' sidecar
// files add (data/sample_meta.h).
std::unique_ptr<RowSource> open_source(const std::string& src, const CaptionSources& captions = {});

}  // namespace sana::data
