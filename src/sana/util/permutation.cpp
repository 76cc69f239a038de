#include "sana/util/permutation.h"

#include <stdexcept>

namespace sana::util {

namespace {
constexpr int kRounds = 6;  // four are a pseudo-random permutation (Luby-Rackoff); two spare

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

KeyedPermutation::KeyedPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  if (n > (uint64_t{1} << 62)) throw std::invalid_argument("KeyedPermutation: n above 2^62");
  while ((uint64_t{1} << (2 * bits_)) < n) ++bits_;
  mask_ = (uint64_t{1} << bits_) - 1;
}

uint64_t KeyedPermutation::round(int r, uint64_t half) const {
  return mix(key_ ^ mix(half * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(r) + 1)) & mask_;
}

uint64_t KeyedPermutation::forward(uint64_t x) const {
  uint64_t left = x >> bits_, right = x & mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t next = left ^ round(r, right);
    left = right;
    right = next;
  }
  return left << bits_ | right;
}

uint64_t KeyedPermutation::backward(uint64_t y) const {
  uint64_t left = y >> bits_, right = y & mask_;
  for (int r = kRounds - 1; r >= 0; --r) {
    const uint64_t prev = right ^ round(r, left);
    right = left;
    left = prev;
  }
  return left << bits_ | right;
}

// Cycle-walking: apply the permutation of the larger domain until the value lands in
// [0, n). It ends (the cycle through x returns to x < n) and stays a bijection of [0, n).
uint64_t KeyedPermutation::operator()(uint64_t x) const {
  if (x >= n_) throw std::out_of_range("KeyedPermutation: argument outside [0, n)");
  do {
    x = forward(x);
  } while (x >= n_);
  return x;
}

uint64_t KeyedPermutation::inverse(uint64_t y) const {
  if (y >= n_) throw std::out_of_range("KeyedPermutation: argument outside [0, n)");
  do {
    y = backward(y);
  } while (y >= n_);
  return y;
}

}  // namespace sana::util
