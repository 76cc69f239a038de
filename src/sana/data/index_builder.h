// Builds a dataset index from sources: image folders (recursive; captions from sidecar
// .txt/.json files), JSONL or CSV metadata files, and existing indexes. Streams its input
// (never holds all rows), reads missing image sizes from headers on several threads,
// shows progress, and is deterministic: the same input gives the same bytes. The file
// appears atomically (written aside, then renamed). No torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sana/data/index_sources.h"
#include "sana/data/sample_meta.h"

namespace sana::data {

struct IndexBuildOptions {
  int threads = 0;                   // header-reading threads; 0 = all cores
  double progress_every_s = 2.0;     // progress lines on stderr; 0 = none
  std::function<void(uint64_t rows)> on_rows;  // after every chunk (e.g. to tell waiting ranks)
  // Sizes read from headers as decoded with the EXIF orientation applied (data.exif_orientation);
  // an index built one way is kept apart from one built the other way.
  bool exif_orientation = false;
  // The files beside wids shards read into each sample's metadata (part of the cache key).
  CaptionSources captions;
  // Rows it returns false for are left out (a filtered index built from another).
  std::function<bool(const IndexRow&)> keep;
};

struct IndexBuildResult {
  uint64_t rows = 0;
  uint64_t sizes_read = 0;  // rows whose size came from the image header
  uint64_t unreadable = 0;  // rows whose image header could not be read (kept, flagged)
  uint64_t bytes = 0;
  double seconds = 0;
  std::string fingerprint;
};

// Throws IndexError naming the source (and line) that could not be read.
IndexBuildResult build_index(const std::vector<std::string>& sources, const std::string& output,
                             const IndexBuildOptions& options = {});

// True when `path` starts with the index magic.
bool is_index_file(const std::string& path);

// The index for `sources`: the file itself when it is the only source and already an
// index; otherwise an index cached under `cache_dir`, keyed by the sources' paths, sizes
// and modification times, the EXIF setting and the caption sources, built when missing.
std::string ensure_index(const std::vector<std::string>& sources, const std::string& cache_dir,
                         const IndexBuildOptions& options = {});

}  // namespace sana::data
