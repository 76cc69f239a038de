// What `sana-train check-data` measures: every sample (or the first N of a shuffled pass)
// decoded through the real loader, counting good and substituted samples by reason and
// timing it. Progress goes to the log; apps/commands/check_data.cpp prints the result.
// The header needs no torch.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "sana/data/dataset.h"
#include "sana/data/loader_options.h"
#include "sana/data/sample_cache.h"

namespace sana::data {

struct CheckDataResult {
  int64_t samples = 0;      // decoded
  int64_t substituted = 0;  // bad, replaced by a substitute
  std::map<std::string, int64_t> bad_by_reason;
  double seconds = 0;
  int workers = 0;
  std::string cache_path;         // --fill-cache: the disk cache filled
  int64_t cache_ready_before = 0;  // its samples ready before
  int64_t cache_bytes = 0;
  int64_t dumped = 0;              // --dump: bucket images written
  double bad_fraction() const { return samples ? static_cast<double>(substituted) / samples : 0.0; }
};

struct CheckDataOptions {
  DatasetOptions dataset;
  LoaderOptions loader;        // workers and decoding; the pass is one sample per step
  int64_t limit = 0;           // samples to decode (0: all)
  bool fill_cache = false;     // every decoded sample also goes into the data.cache: disk file
  DiskCacheOptions disk_cache;  // ... this one, the file training with these settings reads
  int64_t token_cell = 0;      // as Dataset::open's (train.batch_tokens needs it to say what training leaves out)
  // --dump DIR: each decoded sample's bucket image as the model receives it (before
  // normalisation; check-data never flips) as an 8-bit RGB PNG <id>.png, and DIR/dump.tsv
  // with the columns id, path (the source as indexed), height, width (the bucket), file,
  // caption (the one drawn for the sample in epoch 0 with train.seed).
  std::string dump_dir;
};

// Decodes a shuffled pass over the dataset. Throws IndexError when the data cannot be indexed.
CheckDataResult check_data(const CheckDataOptions& options);

}  // namespace sana::data
