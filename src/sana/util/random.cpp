#include "sana/util/random.h"

#include <vector>

#include "sana/util/hash.h"

namespace sana::util {

uint64_t stream_key(std::string_view purpose, std::initializer_list<uint64_t> parts) {
  std::vector<uint64_t> words(parts);
  const uint64_t seed = hash64(purpose.data(), purpose.size());
  return hash64(words.data(), words.size() * sizeof(uint64_t), seed);
}

uint64_t RandomStream::next_u64() {
  uint64_t z = key_ + 0x9e3779b97f4a7c15ULL * ++counter_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t RandomStream::below(uint64_t n) {
  // Lemire: multiply-shift with rejection of the small biased region.
  unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next_u64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

double RandomStream::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

}  // namespace sana::util
