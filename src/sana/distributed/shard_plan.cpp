#include "sana/distributed/shard_plan.h"

#include <algorithm>
#include <stdexcept>

namespace sana::dist {

int64_t ShardPlan::owned_elements(int rank) const {
  int64_t n = 0;
  for (const auto& bucket : segments) {
    for (const auto& s : bucket) n += s.owner == rank ? s.numel() : 0;
  }
  return n;
}

int64_t ShardPlan::total_elements() const {
  int64_t n = 0;
  for (const auto& bucket : segments) {
    for (const auto& s : bucket) n += s.numel();
  }
  return n;
}

int64_t ShardPlan::largest_share() const {
  int64_t most = 0;
  for (int r = 0; r < world; ++r) most = std::max(most, owned_elements(r));
  return most;
}

ShardPlan plan_shards(const std::vector<GradBucket>& buckets, size_t param_count, const std::vector<int64_t>& numels,
                      int world) {
  if (world < 1) throw std::invalid_argument("plan_shards: world size must be at least 1");
  if (numels.size() != param_count) throw std::invalid_argument("plan_shards: one numel per parameter");
  ShardPlan plan;
  plan.world = world;
  plan.owner.assign(param_count, 0);
  int64_t total = 0;
  for (const auto& b : buckets) total += b.numel;
  int64_t base = 0;  // where the bucket starts on the line of all buckets
  for (const auto& b : buckets) {
    std::vector<ShardSegment> segs;
    for (size_t i = 0; i < b.params.size(); ++i) {
      const size_t k = b.params[i];
      const int64_t begin = b.offsets[i], end = begin + numels.at(k);
      // The middle, doubled to stay in integers: owner = floor(mid * W / total).
      const int64_t twice_mid = 2 * base + begin + end;
      const int owner = total == 0 ? 0
                                   : static_cast<int>(std::min<int64_t>(
                                         world - 1, twice_mid * static_cast<int64_t>(world) / (2 * total)));
      plan.owner.at(k) = owner;
      if (segs.empty() || segs.back().owner != owner) {
        segs.push_back({owner, i, 0, begin, end});
      }
      segs.back().count += 1;
      segs.back().end = end;
    }
    plan.segments.push_back(std::move(segs));
    base += b.numel;
  }
  return plan;
}

}  // namespace sana::dist
