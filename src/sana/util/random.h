// Counter-based random streams: every draw is a pure function of a key such as
// (seed, epoch, bucket, purpose), so results never depend on world size, rank, worker
// count or call order, and resuming needs no saved RNG state. Never includes torch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace sana::util {

// A 64-bit key from any number of integers and a purpose tag (xxHash3).
uint64_t stream_key(std::string_view purpose, std::initializer_list<uint64_t> parts);

// splitmix64 over a counter: cheap, stateless per draw, and identical on every platform.
class RandomStream {
 public:
  explicit RandomStream(uint64_t key) : key_(key) {}
  uint64_t next_u64();
  // Uniform in [0, n) without modulo bias (Lemire's method); n > 0.
  uint64_t below(uint64_t n);
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// Fisher-Yates shuffle of [first, last) driven by `stream`.
template <class It>
void shuffle(It first, It last, RandomStream& stream) {
  const auto n = static_cast<uint64_t>(last - first);
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = stream.below(i);
    using std::swap;
    swap(first[static_cast<std::ptrdiff_t>(i - 1)], first[static_cast<std::ptrdiff_t>(j)]);
  }
}

}  // namespace sana::util
