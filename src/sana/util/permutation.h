// A keyed bijection of [0, n) computed per element in O(1) memory: a balanced Feistel
// network over the smallest even-bit power of two >= n, with cycle-walking back into
// [0, n) (at most 4 domain values per range value on average). The epoch plan orders a
// bucket's samples with one (docs/epoch_plan.md): a rank finds the sample at
// any position without holding the order. Pure arithmetic, identical on every platform.
#pragma once

#include <cstdint>

namespace sana::util {

class KeyedPermutation {
 public:
  KeyedPermutation(uint64_t n, uint64_t key);
  uint64_t size() const { return n_; }
  // The image of x in [0, n).
  uint64_t operator()(uint64_t x) const;
  // The x with (*this)(x) == y.
  uint64_t inverse(uint64_t y) const;

 private:
  uint64_t round(int r, uint64_t half) const;
  uint64_t forward(uint64_t x) const;   // a bijection of [0, 2^(2*bits_))
  uint64_t backward(uint64_t y) const;  // its inverse

  uint64_t n_;
  uint64_t key_;
  int bits_ = 1;  // of each half
  uint64_t mask_ = 1;
};

}  // namespace sana::util
