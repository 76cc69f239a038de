// data.cache for a training run: the decoded-sample cache (data/sample_cache.h), one copy
// per node. memory: in shared memory, opened by every rank under one name that rank 0
// picks; once all ranks hold it, the name is removed, so the memory goes back when the run
// ends, even by kill -9. disk: the kept file for this data and these decode settings in
// data.cache_dir, reused by later runs. Refused before training when it would pass
// data.cache_max_gb.
#pragma once

#include <memory>

#include "sana/data/dataset.h"
#include "sana/data/sample_cache.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// data.cache and its keys, by their names (train/options/torch_options.h fills them).
struct SampleCacheOptions {
  enum class Mode { none, memory, disk };
  Mode cache = Mode::none;           // data.cache
  bool precomputed_latents = false;  // data.load_vae_feat: nothing to decode, so no cache
  double cache_max_gb = 0;           // data.cache_max_gb
  data::DiskCacheOptions disk;       // data.cache_dir and the decode settings (disk)
};

// Null when the options ask for no cache or the run reads precomputed latents (nothing to
// decode). Collective: every rank calls it. Throws UsageError past data.cache_max_gb or
// when the shared memory has no room.
std::shared_ptr<data::SampleCache> open_sample_cache(const SampleCacheOptions& o, const data::Dataset& dataset,
                                                     dist::Runtime& rt);

// "epoch 2: 56 samples from the cache, 0 decoded" for the lookups since `hits`/`misses`.
void log_cache_use(const data::SampleCache& cache, int64_t epoch, int64_t hits_before, int64_t misses_before);

}  // namespace sana::train
