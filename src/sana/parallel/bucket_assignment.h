// Which gradients travel together: the pure assignment of parameters to all-reduce
// buckets (sizes, order, dtype), with no tensors, so it is unit-tested alone. The reducer
// (reducer.h) executes its result; nothing here knows about autograd or collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sana::parallel {

constexpr int64_t kBucketAlignBytes = 64;

// One parameter as the assignment sees it. dtype is any integer id of the element type
// (the reducer uses the int value of the scalar type); buckets never mix two ids.
struct ParamInfo {
  std::string name;
  int64_t numel = 0;
  int64_t element_size = 0;  // bytes per element
  int dtype = 0;
};

// One bucket: the parameters flattened into one tensor for one all-reduce.
struct GradBucket {
  std::vector<size_t> params;    // indices into compute_buckets()'s input, in bucket order
  // Element offset of each of them in the flat bucket: each starts at the first 64-byte
  // boundary after the previous one (parameters and gradients are views into flat
  // buckets, and matrix kernels and vector loads are slower on unaligned memory: measured
  // 3-4% of a step). The gaps hold zeros and are never read as a parameter.
  std::vector<int64_t> offsets;
  int64_t numel = 0;  // elements in the flat bucket (the last parameter's end)
  int dtype = 0;
};

// Buckets in the order their all-reduces start. The rule:
//  - Parameters are taken in reverse registration order (the last registered first), which
//    is roughly the order backward produces their gradients.
//  - A parameter joins the last bucket unless that bucket would then exceed its cap in
//    bytes, or its dtype differs, or it belongs to another element of a module list
//    (module_unit(): "blocks.3." and "blocks.4." never share a bucket, so a block swapped
//    between host and device, train.offload_blocks, owns whole buckets); then it starts a
//    new bucket. Bucket 0 is capped at
//    first_cap_bytes (a small first bucket starts communicating early in backward); every
//    later bucket at cap_bytes. (The engine has always chosen the cap as "buckets so far
//    <= 1 ? first : cap": the cap of the bucket being filled, so bucket 0 alone gets the
//    first cap; the parameter that overflows it opens bucket 1, whatever its size.)
//  - So no bucket holds more than its cap unless it holds a single parameter larger than
//    the cap (such a parameter gets a bucket of its own), and a parameter is never split.
//  - Every parameter of the input is assigned, including those that may never get a
//    gradient: the reducer zero-fills theirs, so every rank issues every bucket.
// Deterministic: the same input gives the same buckets on every rank, which is what keeps
// the ranks' collectives in the same order. Empty input: no buckets.
std::vector<GradBucket> compute_buckets(const std::vector<ParamInfo>& params, int64_t cap_bytes,
                                        int64_t first_cap_bytes);

// The element of a module list a parameter's dotted name lies in: the name up to its first
// all-digit part ("blocks.3.attn.qkv.weight": "blocks.3"), or "" for none ("x_embedder.proj.weight").
std::string module_unit(const std::string& name);

// The same with the caps in MiB, as ddp.bucket_cap_mb gives them (what the reducer and the
// memory estimate both use).
std::vector<GradBucket> compute_buckets_mb(const std::vector<ParamInfo>& params, double cap_mb, double first_cap_mb);

// The inverse map: result[param] is the index of the bucket holding that parameter.
// param_count is the size of compute_buckets()'s input.
std::vector<size_t> bucket_of_params(const std::vector<GradBucket>& buckets, size_t param_count);

}  // namespace sana::parallel
