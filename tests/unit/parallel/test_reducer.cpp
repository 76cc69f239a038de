// The gradient reducer's bucket assignment on its own, without processes or tensors: a
// case worked out by hand, the small first bucket, reverse order, caps, oversized
// parameters, dtype changes, empty input, and the properties every assignment must have.
#include "catch.h"

#include <cstdint>
#include <string>
#include <vector>

#include "sana/parallel/bucket_assignment.h"

using namespace sana::parallel;

namespace {

constexpr int kF32 = 6;  // any ids will do; these are torch's ScalarType values
constexpr int kF16 = 5;

ParamInfo f32(int64_t numel) { return {"p", numel, 4, kF32}; }
ParamInfo f16(int64_t numel) { return {"h", numel, 2, kF16}; }

int64_t bytes_of(const GradBucket& b, const std::vector<ParamInfo>& params) {
  int64_t bytes = 0;
  for (size_t k : b.params) bytes += params[k].numel * params[k].element_size;
  return bytes;
}

// What any assignment must satisfy, whatever the sizes.
void check_properties(const std::vector<ParamInfo>& params, const std::vector<GradBucket>& buckets, int64_t cap,
                      int64_t first_cap) {
  // Every parameter exactly once, in reverse registration order across the buckets.
  std::vector<size_t> order;
  for (const auto& b : buckets) order.insert(order.end(), b.params.begin(), b.params.end());
  REQUIRE(order.size() == params.size());
  for (size_t i = 0; i < order.size(); ++i) REQUIRE(order[i] == params.size() - 1 - i);

  const auto bucket_of = bucket_of_params(buckets, params.size());
  REQUIRE(bucket_of.size() == params.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    const auto& b = buckets[i];
    INFO("bucket " << i);
    REQUIRE_FALSE(b.params.empty());
    REQUIRE(b.offsets.size() == b.params.size());
    // Each parameter starts at the first 64-byte boundary at or after the previous one's end.
    int64_t next = 0;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const int64_t align = kBucketAlignBytes / params[b.params[j]].element_size;
      next = (next + align - 1) / align * align;
      REQUIRE(b.offsets[j] == next);
      next += params[b.params[j]].numel;
      REQUIRE(params[b.params[j]].dtype == b.dtype);  // one dtype a bucket
      REQUIRE(bucket_of[b.params[j]] == i);
    }
    REQUIRE(b.numel == next);
    // Within the cap, unless the bucket is one parameter larger than it.
    const int64_t this_cap = i == 0 ? first_cap : cap;
    if (b.params.size() > 1) REQUIRE(bytes_of(b, params) <= this_cap);
    // Greedy: the next bucket starts only because its first parameter did not fit (or
    // had another dtype), so buckets are as full as the caps allow.
    if (i + 1 < buckets.size()) {
      const auto& head = params[buckets[i + 1].params.front()];
      const bool other_dtype = head.dtype != b.dtype;
      const bool other_unit = module_unit(head.name) != module_unit(params[b.params.back()].name);
      REQUIRE((other_dtype || other_unit || bytes_of(b, params) + head.numel * head.element_size > this_cap));
    }
  }
}

}  // namespace

TEST_CASE("reducer buckets: a case worked out by hand", "[reducer][buckets]") {
  // Registration order p0..p5 (bytes 20, 40, 12, 16, 24, 8); first cap 40 bytes, cap 64.
  // Reverse order: p5 (8) + p4 (24) = 32 fit bucket 0; p3 (16) would make 48 > 40: bucket 1;
  // p2 (12) makes 28; p1 (40) would make 68 > 64: bucket 2; p0 (20) makes 60.
  const std::vector<ParamInfo> params{f32(5), f32(10), f32(3), f32(4), f32(6), f32(2)};
  const auto buckets = compute_buckets(params, 64, 40);
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].params == std::vector<size_t>{5, 4});
  // Offsets on 64-byte (16-float) boundaries; caps count the parameters' own bytes.
  CHECK(buckets[0].offsets == std::vector<int64_t>{0, 16});
  CHECK(buckets[0].numel == 22);
  CHECK(buckets[1].params == std::vector<size_t>{3, 2});
  CHECK(buckets[1].offsets == std::vector<int64_t>{0, 16});
  CHECK(buckets[1].numel == 19);
  CHECK(buckets[2].params == std::vector<size_t>{1, 0});
  CHECK(buckets[2].offsets == std::vector<int64_t>{0, 16});
  CHECK(buckets[2].numel == 21);
  for (const auto& b : buckets) CHECK(b.dtype == kF32);
  CHECK(bucket_of_params(buckets, params.size()) == std::vector<size_t>{2, 2, 1, 1, 0, 0});
  check_properties(params, buckets, 64, 40);
}

TEST_CASE("reducer buckets: a small first bucket, then full ones (the trainer's 1 MB and 25 MB)",
          "[reducer][buckets]") {
  const int64_t mb = 1024 * 1024;
  // 250 parameters of 256 KiB: 4 fill the first 1 MiB exactly (a bucket may reach its
  // cap), then 100 fill each 25 MiB, and 46 are left.
  const std::vector<ParamInfo> params(250, f32(64 * 1024));
  const auto buckets = compute_buckets(params, 25 * mb, 1 * mb);
  REQUIRE(buckets.size() == 4);
  CHECK(buckets[0].params.size() == 4);
  CHECK(buckets[1].params.size() == 100);
  CHECK(buckets[2].params.size() == 100);
  CHECK(buckets[3].params.size() == 46);
  CHECK(buckets[0].params.front() == 249);  // the last registered parameter goes first
  CHECK(buckets[3].params.back() == 0);
  check_properties(params, buckets, 25 * mb, 1 * mb);
}

TEST_CASE("reducer buckets: a parameter larger than the cap gets a bucket of its own", "[reducer][buckets]") {
  SECTION("in the middle") {
    // Reverse order: c (40 bytes), big (400), a (40); caps of 100 bytes.
    const std::vector<ParamInfo> params{f32(10), f32(100), f32(10)};
    const auto buckets = compute_buckets(params, 100, 100);
    REQUIRE(buckets.size() == 3);
    CHECK(buckets[0].params == std::vector<size_t>{2});
    CHECK(buckets[1].params == std::vector<size_t>{1});
    CHECK(buckets[1].numel == 100);
    CHECK(buckets[2].params == std::vector<size_t>{0});
    check_properties(params, buckets, 100, 100);
  }
  SECTION("first, over the first cap") {
    const std::vector<ParamInfo> params{f32(2), f32(3), f32(1000)};
    const auto buckets = compute_buckets(params, 100, 16);
    REQUIRE(buckets.size() == 2);
    CHECK(buckets[0].params == std::vector<size_t>{2});
    CHECK(buckets[1].params == std::vector<size_t>{1, 0});  // 20 bytes: fit the later cap
    check_properties(params, buckets, 100, 16);
  }
  SECTION("a zero cap: one parameter a bucket") {
    const std::vector<ParamInfo> params{f32(1), f32(1), f32(1)};
    const auto buckets = compute_buckets(params, 0, 0);
    CHECK(buckets.size() == 3);
    check_properties(params, buckets, 0, 0);
  }
}

TEST_CASE("reducer buckets: a dtype change starts a new bucket", "[reducer][buckets]") {
  // Reverse order: e (f32), d and c (f16), b and a (f32); the caps would hold them all.
  const std::vector<ParamInfo> params{f32(4), f32(4), f16(4), f16(4), f32(4)};
  const auto buckets = compute_buckets(params, 1 << 20, 1 << 20);
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].params == std::vector<size_t>{4});
  CHECK(buckets[0].dtype == kF32);
  CHECK(buckets[1].params == std::vector<size_t>{3, 2});
  CHECK(buckets[1].dtype == kF16);
  CHECK(buckets[2].params == std::vector<size_t>{1, 0});  // f32 again: not merged into bucket 0
  CHECK(buckets[2].dtype == kF32);
  check_properties(params, buckets, 1 << 20, 1 << 20);

  // Bytes count each dtype's element size: 8 f16 elements are 16 bytes and fit a 16-byte
  // bucket, 8 f32 elements do not.
  CHECK(compute_buckets({f16(4), f16(4)}, 16, 16).size() == 1);
  CHECK(compute_buckets({f32(2), f32(2)}, 16, 16).size() == 1);
  CHECK(compute_buckets({f32(4), f32(4)}, 16, 16).size() == 2);
}

TEST_CASE("reducer buckets: two blocks of a module list never share a bucket", "[reducer][buckets]") {
  CHECK(module_unit("blocks.3.attn.qkv.weight") == "blocks.3");
  CHECK(module_unit("controlnet.blocks.12.weight") == "controlnet.blocks.12");
  CHECK(module_unit("blocks.3") == "blocks.3");
  CHECK(module_unit("x_embedder.proj.weight").empty());
  CHECK(module_unit("p0.w1").empty());  // digits within a name are not an index
  // Reverse order: head, blocks.1's two, blocks.0's two, the embedder; the caps would hold
  // them all in one bucket.
  const std::vector<ParamInfo> params{{"embed.weight", 4, 4, kF32},   {"blocks.0.a", 4, 4, kF32},
                                      {"blocks.0.b", 4, 4, kF32},     {"blocks.1.a", 4, 4, kF32},
                                      {"blocks.1.b", 4, 4, kF32},     {"head.weight", 4, 4, kF32}};
  const auto buckets = compute_buckets(params, 1 << 20, 1 << 20);
  REQUIRE(buckets.size() == 4);
  CHECK(buckets[0].params == std::vector<size_t>{5});
  CHECK(buckets[1].params == std::vector<size_t>{4, 3});
  CHECK(buckets[2].params == std::vector<size_t>{2, 1});
  CHECK(buckets[3].params == std::vector<size_t>{0});
  check_properties(params, buckets, 1 << 20, 1 << 20);
  // Within one block the caps still split.
  const std::vector<ParamInfo> big{{"blocks.0.a", 4, 4, kF32}, {"blocks.0.b", 4, 4, kF32}};
  CHECK(compute_buckets(big, 16, 16).size() == 2);
}

TEST_CASE("reducer buckets: no parameters, no buckets", "[reducer][buckets]") {
  const auto buckets = compute_buckets({}, 100, 10);
  CHECK(buckets.empty());
  CHECK(bucket_of_params(buckets, 0).empty());
}

TEST_CASE("reducer buckets: properties over many generated inputs", "[reducer][buckets]") {
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {  // a small LCG: the same inputs on every run
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  int multi = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<ParamInfo> params(next(40));
    for (auto& p : params) {
      p = next(4) == 0 ? f16(static_cast<int64_t>(next(300))) : f32(static_cast<int64_t>(next(300)));
    }
    const int64_t cap = static_cast<int64_t>(next(2000));
    const int64_t first_cap = static_cast<int64_t>(next(500));
    INFO("round " << round << ": " << params.size() << " parameters, cap " << cap << ", first cap " << first_cap);
    const auto buckets = compute_buckets(params, cap, first_cap);
    check_properties(params, buckets, cap, first_cap);
    for (const auto& b : buckets) multi += b.params.size() > 1;
    // The same input, the same assignment (what keeps every rank's collectives in order).
    const auto again = compute_buckets(params, cap, first_cap);
    REQUIRE(again.size() == buckets.size());
    for (size_t i = 0; i < again.size(); ++i) REQUIRE(again[i].params == buckets[i].params);
  }
  CHECK(multi > 100);  // the inputs do exercise buckets of several parameters
}
