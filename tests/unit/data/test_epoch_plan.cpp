// Properties of the epoch plan over many combinations of dataset size, bucket skew,
// global batch, world size, micro-batch split, tail policy and epoch: what makes
// multi-scale training unable to hang at an epoch end and resumable at any world size.
#include "catch.h"

#include <algorithm>
#include <map>
#include <set>

#include "sana/data/epoch_plan.h"
#include "sana/util/permutation.h"
#include "sana/util/random.h"
#include "test_support.h"

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

std::shared_ptr<const BucketMembers> members_of(const std::vector<uint16_t>& bucket_of, int buckets) {
  return std::make_shared<const BucketMembers>(bucket_of, buckets);
}

// Every step through the cursor, checked against random access to the same step.
std::vector<StepBatch> all_steps(const EpochPlan& plan, int64_t from = 0) {
  std::vector<StepBatch> out;
  auto cursor = plan.cursor(from);
  StepBatch b;
  while (cursor.next(b)) out.push_back(b);
  REQUIRE(static_cast<int64_t>(out.size()) == plan.steps() - from);
  return out;
}

}  // namespace

TEST_CASE("a keyed permutation is a bijection with its inverse, different per key", "[plan]") {
  for (uint64_t n : {1, 2, 3, 5, 16, 17, 1000, 4097}) {
    const sana::util::KeyedPermutation p(n, 42), q(n, 43);
    std::vector<char> hit(n, 0);
    uint64_t moved = 0, differs = 0;
    for (uint64_t x = 0; x < n; ++x) {
      const uint64_t y = p(x);
      REQUIRE(y < n);
      REQUIRE(hit[y] == 0);
      hit[y] = 1;
      REQUIRE(p.inverse(y) == x);
      moved += y != x;
      differs += q(x) != y;
    }
    if (n >= 16) CHECK(moved > n / 2);
    if (n >= 16) CHECK(differs > n / 2);
  }
}

TEST_CASE("epoch plan properties over many combinations", "[plan]") {
  int combos = 0;
  for (int64_t n : {1, 7, 50, 333, 1000}) {
    for (int buckets : {1, 3, 9}) {
      for (int64_t g : {1, 4, 12, 24, 48}) {
        for (TailPolicy tail : {TailPolicy::drop, TailPolicy::pad}) {
          const auto bucket_of = skewed_buckets(n, buckets, static_cast<uint64_t>(n * 31 + buckets));
          const auto members = members_of(bucket_of, buckets);
          std::set<std::string> fingerprints;
          for (int64_t epoch : {0, 1, 2}) {
            const auto plan = EpochPlan::build(members, g, 7, epoch, tail);
            const auto again = EpochPlan::build(members_of(bucket_of, buckets), g, 7, epoch, tail);
            INFO("n=" << n << " buckets=" << buckets << " G=" << g << " tail="
                      << tail_name(tail) << " epoch=" << epoch);
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
            const auto steps = all_steps(plan);
            for (const auto& b : steps) {
              REQUIRE(static_cast<int64_t>(b.ids.size()) == g);
              const auto direct = plan.batch(b.step);  // random access agrees with the cursor
              REQUIRE(direct.bucket == b.bucket);
              REQUIRE(direct.ids == b.ids);
              for (auto id : b.ids) {
                REQUIRE(bucket_of[id] == b.bucket);  // one resolution per batch
                ++seen[id];
              }
            }
            if (tail == TailPolicy::drop) {
              for (const auto& [id, count] : seen) REQUIRE(count == 1);  // nothing twice
              REQUIRE(static_cast<int64_t>(seen.size()) + plan.stats().dropped == n);
            } else {
              REQUIRE(static_cast<int64_t>(seen.size()) == n);  // everything at least once
            }
            // A cursor started anywhere continues the same steps.
            if (plan.steps() > 2) REQUIRE(all_steps(plan, plan.steps() / 2).front().ids == steps[steps.size() / 2].ids);

            // Any world size up to G: the ranks' shares tile each batch, differing by one at most.
            for (int w = 1; w <= std::min<int64_t>(g, 7); ++w) {
              for (int64_t s = 0; s < std::min<int64_t>(plan.steps(), 3); ++s) {
                std::vector<SampleId> joined;
                for (int r = 0; r < w; ++r) {
                  const auto part = plan.rank_slice(s, r, w);
                  REQUIRE(static_cast<int64_t>(part.size()) >= g / w);
                  REQUIRE(static_cast<int64_t>(part.size()) <= g / w + 1);
                  joined.insert(joined.end(), part.begin(), part.end());
                }
                REQUIRE(joined == steps[static_cast<size_t>(s)].ids);
              }
              ++combos;
            }
          }
          // Epochs differ, wherever there is enough to shuffle (8 distinct samples).
          std::set<SampleId> used;
          for (const auto& b : all_steps(EpochPlan::build(members, g, 7, 0, tail))) used.insert(b.ids.begin(), b.ids.end());
          if (used.size() >= 8) CHECK(fingerprints.size() == 3);
        }
      }
    }
  }
  CHECK(combos > 500);
}

TEST_CASE("rank shares: 8 on 3 is 3, 3, 2, and micro-batches of at most the micro size", "[plan]") {
  CHECK(rank_share(8, 0, 3) == std::pair<int64_t, int64_t>{0, 3});
  CHECK(rank_share(8, 1, 3) == std::pair<int64_t, int64_t>{3, 6});
  CHECK(rank_share(8, 2, 3) == std::pair<int64_t, int64_t>{6, 8});
  CHECK(micro_batches(3, 2) == 2);
  CHECK(micro_batches(2, 2) == 1);
  CHECK(micro_batches(0, 2) == 0);
  // train.deterministic: whole micro-batches of 2 dealt out (4 of them on 3 ranks: 2, 1, 1).
  CHECK(rank_share_whole(8, 2, 0, 3) == std::pair<int64_t, int64_t>{0, 4});
  CHECK(rank_share_whole(8, 2, 1, 3) == std::pair<int64_t, int64_t>{4, 6});
  CHECK(rank_share_whole(8, 2, 2, 3) == std::pair<int64_t, int64_t>{6, 8});
  CHECK(rank_share_whole(7, 2, 1, 2) == std::pair<int64_t, int64_t>{4, 7});  // the last micro-batch smaller
  CHECK(rank_share_whole(4, 2, 2, 3).first == rank_share_whole(4, 2, 2, 3).second);  // no micro-batch left
}

TEST_CASE("a batch size changed mid-epoch re-batches exactly the samples not yet seen", "[plan]") {
  const auto bucket_of = skewed_buckets(997, 6, 3);
  const auto members = members_of(bucket_of, 6);
  for (TailPolicy tail : {TailPolicy::drop, TailPolicy::pad}) {
    const auto first = EpochPlan::build(members, 8, 11, 4, tail);
    for (int64_t k1 : {int64_t{0}, int64_t{1}, first.steps() / 3, first.steps() - 1}) {
      // 8 until step k1, then 12; then 4 from a step k2 of that plan.
      const auto second = EpochPlan::build(members, {{0, std::vector<int64_t>(6, 8)}, {k1, std::vector<int64_t>(6, 12)}},
                                           11, 4, tail);
      const int64_t k2 = k1 + (second.steps() - k1) / 2;
      const auto third = EpochPlan::build(
          members, {{0, std::vector<int64_t>(6, 8)}, {k1, std::vector<int64_t>(6, 12)}, {k2, std::vector<int64_t>(6, 4)}},
          11, 4, tail);
      INFO("tail " << tail_name(tail) << " k1=" << k1 << " k2=" << k2);
      // The steps before a change are the earlier plan's.
      for (int64_t s = 0; s < k1; ++s) REQUIRE(third.batch(s).ids == first.batch(s).ids);
      for (int64_t s = k1; s < k2; ++s) REQUIRE(third.batch(s).ids == second.batch(s).ids);
      std::map<SampleId, int> seen;
      for (const auto& b : all_steps(third)) {
        const size_t want = b.step < k1 ? 8 : b.step < k2 ? 12 : 4;
        REQUIRE(b.ids.size() == want);
        for (auto id : b.ids) ++seen[id];
      }
      if (tail == TailPolicy::drop) {
        for (const auto& [id, count] : seen) REQUIRE(count == 1);
        REQUIRE(static_cast<int64_t>(seen.size()) + third.stats().dropped == 997);
        REQUIRE(third.stats().dropped < 6 * 4);  // only the last batch size's tails
      } else {
        REQUIRE(seen.size() == 997);
      }
    }
  }
}

TEST_CASE("a bucket smaller than one global batch is dropped or padded, never a short batch",
          "[plan]") {
  std::vector<uint16_t> bucket_of(10, 0);
  bucket_of.push_back(1);  // one lonely panorama
  const auto members = members_of(bucket_of, 2);
  auto drop = EpochPlan::build(members, 8, 1, 0, TailPolicy::drop);
  CHECK(drop.steps() == 1);
  CHECK(drop.stats().dropped == 3);
  CHECK(drop.stats().steps_per_bucket == std::vector<int64_t>{1, 0});
  auto pad = EpochPlan::build(members, 8, 1, 0, TailPolicy::pad);
  CHECK(pad.steps() == 3);
  CHECK(pad.stats().padded == 6 + 7);
  int lonely = 0;
  for (const auto& b : all_steps(pad)) {
    if (b.bucket == 1) {
      ++lonely;
      CHECK(std::all_of(b.ids.begin(), b.ids.end(), [](SampleId id) { return id == 10; }));
    }
  }
  CHECK(lonely == 1);
}

TEST_CASE("bucket batches spread over the epoch: each bucket's batches in order, interleaved", "[plan]") {
  // 3 buckets of 400, 200 and 40 samples, G 8: 50, 25 and 5 batches.
  std::vector<uint16_t> bucket_of;
  const size_t sizes[] = {400, 200, 40};
  for (uint16_t b = 0; b < 3; ++b) bucket_of.insert(bucket_of.end(), sizes[b], b);
  const auto plan = EpochPlan::build(members_of(bucket_of, 3), 8, 5, 0, TailPolicy::drop);
  REQUIRE(plan.steps() == 80);
  std::vector<int> first_half(3, 0);
  for (const auto& b : all_steps(plan)) {
    if (b.step < 40) ++first_half[static_cast<size_t>(b.bucket)];
  }
  // Stratified: about half of each bucket's batches fall in each half of the epoch.
  CHECK(std::abs(first_half[0] - 25) <= 1);
  CHECK(std::abs(first_half[1] - 12) <= 1);
  CHECK(std::abs(first_half[2] - 2) <= 1);
}

TEST_CASE("bucket members kept in a file are reused, and built anew for another key", "[plan]") {
  sana::test::TempDir dir;
  const std::string path = dir.path("index/buckets.bin");
  int calls = 0;
  // Samples 0..99: bucket i % 3, except every 10th, of unknown size.
  const auto bucket = [&](uint64_t i) -> uint16_t {
    ++calls;
    return i % 10 == 0 ? BucketMembers::kUnknown : static_cast<uint16_t>(i % 3);
  };
  const auto first = BucketMembers::mapped(path, 1, 100, 3, bucket);
  CHECK(calls == 100);
  CHECK(first->is_mapped());
  CHECK(first->unknown() == 10);
  // 90 known: 30 in each bucket; the 10 unknown join the first most common (bucket 0).
  CHECK(first->count(0) == 40);
  CHECK(first->count(1) == 30);
  CHECK(first->count(2) == 30);
  CHECK(first->bucket_of(10) == 0);
  for (int b = 0; b < 3; ++b) {
    for (int64_t k = 1; k < first->count(b); ++k) CHECK(first->member(b, k - 1) < first->member(b, k));
  }
  const auto again = BucketMembers::mapped(path, 1, 100, 3, bucket);
  CHECK(calls == 100);  // read back, not computed
  CHECK(again->member(2, 5) == first->member(2, 5));
  const auto other = BucketMembers::mapped(path, 2, 100, 3, [](uint64_t) -> uint16_t { return 1; });
  CHECK(other->count(1) == 100);
  const auto in_memory = BucketMembers(std::vector<uint16_t>{2, 0, 2}, 3);
  CHECK(in_memory.count(2) == 2);
  CHECK(in_memory.member(2, 1) == 2);
  CHECK_FALSE(in_memory.is_mapped());
}
