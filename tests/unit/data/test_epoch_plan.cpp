// Properties of the epoch plan over many combinations of dataset size, bucket skew,
// global batch, world size, micro-batch split, tail policy and epoch: what makes
// multi-scale training unable to hang at an epoch end and resumable at any world size.
#include "catch.h"

#include <algorithm>
#include <map>
#include <set>

#include "sana/data/epoch_plan.h"
#include "sana/util/random.h"

using namespace sana::data;

namespace {

// Very uneven buckets: bucket b gets weight 2^-b, so the last ones hold a sample or two.
std::vector<uint16_t> skewed_buckets(int64_t n, int buckets, uint64_t seed) {
  sana::util::RandomStream rng(sana::util::stream_key("test.buckets", {seed}));
  std::vector<uint16_t> out;
  for (int64_t i = 0; i < n; ++i) {
    int b = 0;
    while (b + 1 < buckets && rng.below(2) == 1) ++b;
    out.push_back(static_cast<uint16_t>(b));
  }
  return out;
}

std::vector<int> worlds_for(int64_t g, int64_t micro) {
  std::vector<int> out;
  for (int w : {1, 2, 3, 4, 6, 8}) {
    if (g % (micro * w) == 0) out.push_back(w);
  }
  return out;
}

}  // namespace

TEST_CASE("epoch plan properties over many combinations", "[plan]") {
  int combos = 0;
  for (int64_t n : {1, 7, 50, 333, 1000}) {
    for (int buckets : {1, 3, 9}) {
      for (int64_t g : {1, 4, 12, 24, 48}) {
        for (TailPolicy tail : {TailPolicy::drop, TailPolicy::pad}) {
          const auto bucket_of = skewed_buckets(n, buckets, static_cast<uint64_t>(n * 31 + buckets));
          std::set<std::string> fingerprints;
          for (int64_t epoch : {0, 1, 2}) {
            const auto plan = EpochPlan::build(bucket_of, buckets, g, 7, epoch, tail);
            const auto again = EpochPlan::build(bucket_of, buckets, g, 7, epoch, tail);
            INFO("n=" << n << " buckets=" << buckets << " G=" << g << " tail="
                      << sana::config::name_of(tail) << " epoch=" << epoch);
            // Every rank computes the same plan: same steps, same contents.
            REQUIRE(plan.steps() == again.steps());
            REQUIRE(plan.fingerprint() == again.fingerprint());
            fingerprints.insert(plan.fingerprint());

            // Step count follows from bucket sizes alone.
            int64_t expected_steps = 0;
            for (int64_t c : plan.stats().samples_per_bucket) {
              expected_steps += tail == TailPolicy::drop ? c / g : (c + g - 1) / g;
            }
            REQUIRE(plan.steps() == expected_steps);

            std::map<SampleId, int> seen;
            for (int64_t s = 0; s < plan.steps(); ++s) {
              const SampleId* b = plan.batch(s);
              for (int64_t k = 0; k < g; ++k) {
                REQUIRE(bucket_of[b[k]] == plan.bucket(s));  // one resolution per batch
                ++seen[b[k]];
              }
            }
            if (tail == TailPolicy::drop) {
              for (const auto& [id, count] : seen) REQUIRE(count == 1);  // nothing twice
              REQUIRE(static_cast<int64_t>(seen.size()) + plan.stats().dropped == n);
            } else {
              REQUIRE(static_cast<int64_t>(seen.size()) == n);  // everything at least once
            }

            // For every world size and micro-batch split, ranks' slices form each batch
            // exactly, in order; resuming at any step at any W continues the same stream.
            for (int64_t micro : {int64_t{1}, int64_t{2}, int64_t{4}}) {
              for (int w : worlds_for(g, micro)) {
                const int64_t accumulation = g / (micro * w);
                for (int64_t s = 0; s < plan.steps(); ++s) {
                  std::vector<SampleId> joined;
                  for (int64_t t = 0; t < accumulation; ++t) {
                    for (int r = 0; r < w; ++r) {
                      const auto part = plan.micro_batch(s, r, w, micro, t);
                      joined.insert(joined.end(), part.begin(), part.end());
                    }
                  }
                  REQUIRE(std::equal(joined.begin(), joined.end(), plan.batch(s)));
                }
                ++combos;
              }
            }
          }
          // Epochs differ, wherever there is enough to shuffle (8 distinct samples).
          const auto p0 = EpochPlan::build(bucket_of, buckets, g, 7, 0, tail);
          std::set<SampleId> used;
          for (int64_t s = 0; s < p0.steps(); ++s) used.insert(p0.batch(s), p0.batch(s) + g);
          if (used.size() >= 8) CHECK(fingerprints.size() == 3);
        }
      }
    }
  }
  CHECK(combos > 500);
}

TEST_CASE("resuming at a step boundary on another world size yields the rest of the plan",
          "[plan]") {
  const auto bucket_of = skewed_buckets(997, 6, 3);
  const int64_t g = 24;
  const auto plan = EpochPlan::build(bucket_of, 6, g, 11, 4, TailPolicy::drop);
  REQUIRE(plan.steps() > 5);
  // A run on 2 ranks stops after step k; a run on 3 ranks resumes there. Together they
  // see exactly the plan's samples for the epoch, each once.
  for (int64_t k = 0; k <= plan.steps(); ++k) {
    std::multiset<SampleId> seen;
    for (int64_t s = 0; s < k; ++s) {
      for (int r = 0; r < 2; ++r) {
        for (auto id : plan.rank_slice(s, r, 2, 4)) seen.insert(id);
      }
    }
    const auto resumed = EpochPlan::build(bucket_of, 6, g, 11, 4, TailPolicy::drop);
    for (int64_t s = k; s < resumed.steps(); ++s) {
      for (int r = 0; r < 3; ++r) {
        for (auto id : resumed.rank_slice(s, r, 3, 2)) seen.insert(id);
      }
    }
    REQUIRE(static_cast<int64_t>(seen.size()) == plan.steps() * g);
    REQUIRE(std::set<SampleId>(seen.begin(), seen.end()).size() == seen.size());
  }
}

TEST_CASE("a bucket smaller than one global batch is dropped or padded, never a short batch",
          "[plan]") {
  std::vector<uint16_t> bucket_of(10, 0);
  bucket_of.push_back(1);  // one lonely panorama
  auto drop = EpochPlan::build(bucket_of, 2, 8, 1, 0, TailPolicy::drop);
  CHECK(drop.steps() == 1);
  CHECK(drop.stats().dropped == 3);
  auto pad = EpochPlan::build(bucket_of, 2, 8, 1, 0, TailPolicy::pad);
  CHECK(pad.steps() == 3);
  CHECK(pad.stats().padded == 6 + 7);
  int lonely = 0;
  for (int64_t s = 0; s < pad.steps(); ++s) {
    if (pad.bucket(s) == 1) {
      ++lonely;
      CHECK(std::all_of(pad.batch(s), pad.batch(s) + 8, [](SampleId id) { return id == 10; }));
    }
  }
  CHECK(lonely == 1);
}

TEST_CASE("a micro-batch split that does not fit the global batch is refused", "[plan]") {
  const auto plan = EpochPlan::build(std::vector<uint16_t>(64, 0), 1, 16, 1, 0, TailPolicy::drop);
  CHECK_THROWS_WITH(plan.micro_batch(0, 2, 3, 4, 1), Catch::Contains("outside a global batch"));
}
