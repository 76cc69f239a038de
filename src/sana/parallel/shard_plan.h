// Who owns what under train.zero_stage >= 1: the pure assignment of every parameter to
// one rank, from the gradient buckets (bucket_assignment.h), with no tensors, so it is
// unit-tested alone. Ownership is by whole parameters, contiguous along the buckets' order:
// the buckets laid end to end form one line of elements, rank r owns the parameters whose
// middle falls in the r-th 1/W of that line. Whole parameters because CAME's factored
// statistics and update RMS, the 8-bit moments' row blocks and the per-parameter
// gradient norm each need a whole matrix on one rank; a split matrix would need partial
// sums from several ranks for every parameter at every step. The price: a rank's share
// differs from 1/W by at most half the largest parameter (on each side).
// Contiguous, so each bucket splits into a few segments (usually one owner, two where
// a rank's share ends): one reduce and one broadcast per segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sana/parallel/bucket_assignment.h"

namespace sana::parallel {

// A run of a bucket's parameters with one owner: bucket positions [first, first + count)
// (indices into GradBucket::params), elements [begin, end) of the bucket's flat tensor
// (the first one's offset to the last one's end: the alignment gaps between them included).
struct ShardSegment {
  int owner = 0;
  size_t first = 0, count = 0;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
};

struct ShardPlan {
  int world = 1;
  std::vector<int> owner;                            // per parameter (compute_buckets()'s input order)
  std::vector<std::vector<ShardSegment>> segments;   // per bucket, in element order
  // Elements rank r keeps of the flat buckets: its segments' sizes summed.
  int64_t owned_elements(int rank) const;
  int64_t total_elements() const;  // every rank's share summed
  // The largest share over ranks, in elements.
  int64_t largest_share() const;
};

// ZeRO stage 3: the most elements of other ranks' segments rank `rank` holds at once, when
// the parameters fall into units (`unit_of`, per parameter; 0 = outside the blocks, held
// through a whole forward and backward; k >= 1 one block) and a unit's segments are held
// while it runs: unit 0 with one block in the forward, with two neighbours in the backward
// (the next block is gathered before the last one's parameters all have gradients). A
// segment shared by several units counts once. `own_too`: the rank's own segments count
// as well (half-precision gathers copy them too).
int64_t largest_gather(const ShardPlan& plan, const std::vector<GradBucket>& buckets, const std::vector<size_t>& unit_of,
                       int rank, bool own_too = false);

// Every parameter of `buckets` (param_count of them) owned by one of `world` ranks as
// above. world 1: rank 0 owns everything, one segment per bucket.
ShardPlan plan_shards(const std::vector<GradBucket>& buckets, size_t param_count, const std::vector<int64_t>& numels,
                      int world);

}  // namespace sana::parallel
