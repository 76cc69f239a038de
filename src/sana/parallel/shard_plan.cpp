#include "sana/parallel/shard_plan.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace sana::parallel {

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

int64_t largest_gather(const ShardPlan& plan, const std::vector<GradBucket>& buckets, const std::vector<size_t>& unit_of,
                       int rank, bool own_too) {
  size_t units = 1;
  for (size_t u : unit_of) units = std::max(units, u + 1);
  // Which of other ranks' segments each unit needs.
  std::vector<std::vector<std::pair<size_t, size_t>>> needs(units);
  for (size_t i = 0; i < buckets.size(); ++i) {
    for (size_t s = 0; s < plan.segments[i].size(); ++s) {
      const auto& seg = plan.segments[i][s];
      if (seg.owner == rank && !own_too) continue;
      for (size_t j = seg.first; j < seg.first + seg.count; ++j) {
        auto& n = needs[unit_of.at(buckets[i].params[j])];
        if (n.empty() || n.back() != std::make_pair(i, s)) n.emplace_back(i, s);
      }
    }
  }
  const auto held = [&](std::vector<size_t> at_once) {
    std::vector<std::pair<size_t, size_t>> all;
    for (size_t u : at_once) {
      if (u < units) all.insert(all.end(), needs[u].begin(), needs[u].end());
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    int64_t n = 0;
    for (const auto& [i, s] : all) n += plan.segments[i][s].numel();
    return n;
  };
  int64_t most = held({0});
  for (size_t u = 1; u < units; ++u) most = std::max(most, held({0, u, u + 1}));
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

}  // namespace sana::parallel
