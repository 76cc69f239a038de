// ZeRO's ownership on its own (parallel/shard_plan.h): whole parameters, contiguous along
// the buckets, every rank's share within half the largest parameter of 1/W, segments that
// tile each bucket's parameters in order.
#include "catch.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "sana/parallel/bucket_assignment.h"
#include "sana/parallel/shard_plan.h"

using namespace sana::parallel;

namespace {

std::vector<GradBucket> buckets_of(const std::vector<int64_t>& numels, int64_t cap_bytes) {
  std::vector<ParamInfo> infos;
  for (auto n : numels) infos.push_back({"p", n, 4, 6});
  return compute_buckets(infos, cap_bytes, cap_bytes / 4);
}

void check_plan(const std::vector<int64_t>& numels, int64_t cap_bytes, int world) {
  const auto buckets = buckets_of(numels, cap_bytes);
  const auto plan = plan_shards(buckets, numels.size(), numels, world);
  INFO("world " << world << ", " << numels.size() << " parameters, " << buckets.size() << " buckets");
  REQUIRE(plan.owner.size() == numels.size());
  REQUIRE(plan.segments.size() == buckets.size());
  int last_owner = 0;
  int64_t total = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    size_t next = 0;
    for (const auto& seg : plan.segments[i]) {
      // Segments tile the bucket's parameters in order; each holds one owner's run.
      REQUIRE(seg.first == next);
      REQUIRE(seg.count > 0);
      next += seg.count;
      REQUIRE(seg.begin == buckets[i].offsets[seg.first]);
      const size_t last = seg.first + seg.count - 1;
      REQUIRE(seg.end == buckets[i].offsets[last] + numels[buckets[i].params[last]]);
      for (size_t j = seg.first; j <= last; ++j) REQUIRE(plan.owner[buckets[i].params[j]] == seg.owner);
      // Contiguous: owners never go back along the buckets.
      REQUIRE(seg.owner >= last_owner);
      REQUIRE(seg.owner < world);
      last_owner = seg.owner;
      total += seg.numel();
    }
    REQUIRE(next == buckets[i].params.size());
  }
  REQUIRE(plan.total_elements() == total);
  const int64_t largest = *std::max_element(numels.begin(), numels.end());
  int64_t line = 0;
  for (const auto& b : buckets) line += b.numel;
  for (int r = 0; r < world; ++r) {
    // Within half the largest parameter (plus alignment) of 1/W on each side, so within one
    // largest parameter in all.
    CHECK(std::abs(plan.owned_elements(r) - line / world) <= largest + 16 * static_cast<int64_t>(numels.size()));
  }
}

}  // namespace

TEST_CASE("ZeRO ownership: two equal parameters on two ranks get one each", "[shard_plan]") {
  const std::vector<int64_t> numels{1024, 1024};
  const auto buckets = buckets_of(numels, 1 << 20);  // one bucket: 8 KiB under the first cap
  REQUIRE(buckets.size() == 1);
  const auto plan = plan_shards(buckets, 2, numels, 2);
  REQUIRE(plan.segments[0].size() == 2);  // one bucket, two owners
  // Buckets run in reverse registration order: parameter 1 comes first on the line.
  CHECK(plan.owner == std::vector<int>{1, 0});
  CHECK(plan.owned_elements(0) == 1024);
  CHECK(plan.owned_elements(1) == 1024);
  CHECK(plan.largest_share() == 1024);
}

TEST_CASE("ZeRO ownership: one process owns everything in one segment per bucket", "[shard_plan]") {
  const std::vector<int64_t> numels{100, 3000, 17, 5000, 64};
  const auto buckets = buckets_of(numels, 8192);
  const auto plan = plan_shards(buckets, numels.size(), numels, 1);
  for (const auto& segs : plan.segments) CHECK(segs.size() == 1);
  CHECK(std::all_of(plan.owner.begin(), plan.owner.end(), [](int o) { return o == 0; }));
}

TEST_CASE("ZeRO ownership is contiguous by whole parameters and balanced within the largest one", "[shard_plan]") {
  std::vector<int64_t> numels;
  uint64_t x = 12345;
  for (int i = 0; i < 200; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    numels.push_back(1 + static_cast<int64_t>((x >> 33) % 50000));
  }
  for (int world : {2, 3, 4, 8, 64}) check_plan(numels, 1 << 20, world);
  // More ranks than parameters: some own nothing, nobody owns a parameter twice.
  check_plan({10, 20, 30}, 1 << 20, 8);
}

TEST_CASE("ZeRO ownership: a rejected world size", "[shard_plan]") {
  CHECK_THROWS(plan_shards({}, 0, {}, 0));
}

TEST_CASE("ZeRO stage 3 holds at most the outside of the blocks with two neighbouring blocks", "[shard_plan]") {
  // a (outside the blocks), b (block 0), c (block 1): one bucket, laid out c, b, a (reverse
  // registration), c at 0, b at 304, a at 512 (64-byte alignment); rank 0 owns c, rank 1 b and a.
  const std::vector<int64_t> numels{100, 200, 300};
  const auto buckets = buckets_of(numels, 1 << 20);
  const auto plan = plan_shards(buckets, 3, numels, 2);
  REQUIRE(plan.owner == std::vector<int>{1, 1, 0});
  const std::vector<size_t> units{0, 1, 2};
  CHECK(largest_gather(plan, buckets, units, 0) == 612 - 304);  // rank 0 needs b and a (one segment)
  CHECK(largest_gather(plan, buckets, units, 1) == 300);        // rank 1 needs c
  // One process holds everything itself.
  CHECK(largest_gather(plan_shards(buckets, 3, numels, 1), buckets, units, 0) == 0);
}
