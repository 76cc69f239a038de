#include "sana/train/input/data_cache.h"

#include <fmt/format.h>

#include <filesystem>
#include <random>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

// Shared memory where the system has it (tmpfs at /dev/shm), else the temporary folder.
std::filesystem::path shared_memory_dir() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

// Every rank of a node opens the same file (no collective: nothing to agree on); another
// node has its own in its own data.cache_dir.
std::shared_ptr<data::SampleCache> open_kept_cache(const data::DiskCacheOptions& o, const data::Dataset& dataset) {
  auto cache = data::open_disk_cache(o, dataset);
  const std::filesystem::path path = cache->path(), dir = path.parent_path();
  log::info("data.cache disk: {} samples, {} in {} ({} decoded by earlier runs)", cache->samples(),
            data::size_text(cache->bytes()), path.string(), cache->ready_at_open());
  int others = 0;
  uint64_t other_bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (e.path() != path && name.rfind("samples-", 0) == 0 && e.path().extension() == ".cache") {
      ++others;
      other_bytes += e.file_size(ec);
    }
  }
  if (others > 0) {
    log::info("data.cache disk: {} other cache file{} in {} ({}) are of other data or decode settings; remove "
              "them if no run needs them", others, others == 1 ? "" : "s", dir.string(), data::size_text(other_bytes));
  }
  return cache;
}

}  // namespace

std::shared_ptr<data::SampleCache> open_sample_cache(const SampleCacheOptions& o, const data::Dataset& dataset,
                                                     dist::Runtime& rt) {
  using Mode = SampleCacheOptions::Mode;
  if (o.cache == Mode::none) return nullptr;
  if (o.precomputed_latents) {
    log::info("data.cache: this run reads precomputed latents (data.load_vae_feat), nothing to decode: no cache");
    return nullptr;
  }
  const auto shape = data::cache_shape(dataset);
  const uint64_t bytes = data::SampleCache::bytes_needed(shape);
  const std::string mode = o.cache == Mode::disk ? "disk" : "memory";
  if (static_cast<double>(bytes) > o.cache_max_gb * (1ull << 30)) {
    throw UsageError(fmt::format(
        "data.cache {}: {} samples decoded at their bucket sizes need {}, more than data.cache_max_gb {}; "
        "raise data.cache_max_gb (every node holds one copy) or set data.cache: none",
        mode, shape.bucket_of.size(), data::size_text(bytes), o.cache_max_gb), "config error");
  }
  if (o.cache == Mode::disk) return open_kept_cache(o.disk, dataset);
  std::string name;
  if (rt.rank() == 0) name = fmt::format("sana-cache-{:016x}", std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}());
  name = rt.all_gather("sample cache name", name).front();
  const auto dir = shared_memory_dir();
  const auto path = (dir / name).string();
  auto cache = std::make_shared<data::SampleCache>(path, shape);
  rt.barrier();      // every rank has it open: the name can go
  cache->unlink();   // (all ranks try; one succeeds per node)
  log::info("data.cache memory: {} samples, {} in {} (one copy per node, freed when the run ends)",
            shape.bucket_of.size(), data::size_text(bytes), dir.string());
  return cache;
}

void log_cache_use(const data::SampleCache& cache, int64_t epoch, int64_t hits_before, int64_t misses_before) {
  const int64_t hits = cache.hits() - hits_before, misses = cache.misses() - misses_before;
  // The first two epochs at info (filling, then serving); later ones at debug.
  if (epoch < 2) {
    log::info("epoch {}: {} samples from the cache, {} decoded", epoch + 1, hits, misses);
  } else {
    log::debug("epoch {}: {} samples from the cache, {} decoded", epoch + 1, hits, misses);
  }
}

}  // namespace sana::train
