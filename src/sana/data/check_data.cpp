#include "sana/data/check_data.h"

#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "sana/data/loader.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::data {

int run_check_data(const config::Config& cfg, int64_t limit) {
  using Clock = std::chrono::steady_clock;
  const Dataset ds = Dataset::open(cfg);
  // A plan of global batches of one: every sample exactly once, in a shuffled order.
  const EpochPlan plan = EpochPlan::build(ds.bucket_of(), ds.buckets().size(), 1,
                                          static_cast<uint64_t>(cfg.train.seed), 0,
                                          TailPolicy::drop);
  const LoaderOptions o = loader_options_for(cfg);
  const int64_t total = limit > 0 ? std::min<int64_t>(limit, plan.steps()) : plan.steps();
  log::info("check-data: decoding {} of {} samples with {} worker{}", total, plan.steps(),
            o.workers, o.workers == 1 ? "" : "s");
  const auto start = Clock::now();
  auto last = start;
  int64_t done = 0, substituted = 0;
  {
    Loader loader(ds, plan, o);
    while (done < total) {
      auto b = loader.next();
      if (!b) break;
      substituted += b->substituted;
      ++done;
      if (Clock::now() - last > std::chrono::seconds(2)) {
        const double secs = std::chrono::duration<double>(Clock::now() - start).count();
        log::info("check-data: {}/{} samples, {:.1f} images/s, {} substituted", done, total,
                  done / secs, substituted);
        last = Clock::now();
      }
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    const auto counts = loader.bad_counts();
    std::cout << fmt::format("check-data: {} samples in {:.1f} s ({:.1f} images/s, {} workers)\n",
                             done, secs, done / secs, o.workers);
    std::cout << fmt::format("  good: {}\n", done - substituted);
    for (const auto& [reason, n] : counts.by_reason) {
      std::cout << fmt::format("  bad, {}: {}\n", reason, n);
    }
    const double fraction = done ? static_cast<double>(substituted) / done : 0.0;
    std::cout << fmt::format("  bad fraction {:.4f} (data.max_bad_fraction {})\n", fraction,
                             cfg.data.max_bad_fraction);
    if (fraction > cfg.data.max_bad_fraction) {
      std::cout << "check-data: too many bad samples; fix or remove them (the log names each "
                   "file once)\n";
      return kExitFailure;
    }
  }
  std::cout << "check-data: ok\n";
  return kExitOk;
}

}  // namespace sana::data
