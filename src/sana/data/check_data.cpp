#include "sana/data/check_data.h"

#include <algorithm>
#include <chrono>

#include "sana/data/loader.h"
#include "sana/data/plan_coverage.h"
#include "sana/util/log.h"

namespace sana::data {

CheckDataResult check_data(const CheckDataOptions& options) {
  using Clock = std::chrono::steady_clock;
  const Dataset ds = Dataset::open(options.dataset, {}, options.token_cell);
  // What training would leave out, said here too (as warnings: this command reads the data).
  check_plan_coverage(ds, ds.plan(0), "check-data", /*refuse=*/false);
  // A plan of global batches of one: every sample exactly once, in a shuffled order.
  const EpochPlan plan = EpochPlan::build(ds.members_ptr(), 1, options.dataset.seed, 0, TailPolicy::drop);
  LoaderOptions o = options.loader;
  const int64_t limit = options.limit;
  const int64_t total = limit > 0 ? std::min<int64_t>(limit, plan.steps()) : plan.steps();
  log::info("check-data: decoding {} of {} samples with {} worker{}", total, plan.steps(),
            o.workers, o.workers == 1 ? "" : "s");
  CheckDataResult r;
  if (options.fill_cache) {
    o.cache = open_disk_cache(options.disk_cache, ds);
    r.cache_path = o.cache->path();
    r.cache_ready_before = o.cache->ready_at_open();
    r.cache_bytes = static_cast<int64_t>(o.cache->bytes());
    log::info("check-data: filling {} ({}, {} samples ready before)", r.cache_path, size_text(o.cache->bytes()),
              r.cache_ready_before);
  }
  r.workers = o.workers;
  const auto start = Clock::now();
  auto last = start;
  Loader loader(ds, plan, o);
  while (r.samples < total) {
    auto b = loader.next();
    if (!b) break;
    r.substituted += b->substituted;
    ++r.samples;
    if (Clock::now() - last > std::chrono::seconds(2)) {
      const double secs = std::chrono::duration<double>(Clock::now() - start).count();
      log::info("check-data: {}/{} samples, {:.1f} images/s, {} substituted", r.samples, total,
                r.samples / secs, r.substituted);
      last = Clock::now();
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.bad_by_reason = loader.bad_counts().by_reason;
  return r;
}

}  // namespace sana::data
