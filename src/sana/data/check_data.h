// What `sana-train check-data` measures: every sample (or the first N of a shuffled pass)
// decoded through the real loader, counting good and substituted samples by reason and
// timing it. Progress goes to the log; apps/commands/check_data.cpp prints the result.
// The header needs no torch.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "sana/config/config.h"

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
  double bad_fraction() const { return samples ? static_cast<double>(substituted) / samples : 0.0; }
};

// Decodes `limit` samples (0: all) of a shuffled pass over the config's data. Throws
// IndexError when the data cannot be indexed. `fill_cache`: every decoded sample also goes
// into the data.cache: disk file that training with these settings reads.
// `token_cell`: as Dataset::open's (train.batch_tokens needs it to say what training leaves out).
CheckDataResult check_data(const config::Config& cfg, int64_t limit, bool fill_cache = false, int64_t token_cell = 0);

}  // namespace sana::data
