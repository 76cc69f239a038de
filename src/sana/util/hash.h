// Hashing shared by checksums, fingerprints and the per-sample random streams: XXH3-64
// over a sequence of byte ranges, as lowercase hex. Streaming, so large tensors and files
// need no copy. No torch here.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace sana {

class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0) : state_(XXH3_createState()) { XXH3_64bits_reset_withSeed(state_, seed); }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  Hasher& update(const void* data, size_t size) {
    XXH3_64bits_update(state_, data, size);
    return *this;
  }
  Hasher& update(std::string_view text) { return update(text.data(), text.size()); }
  // The bytes of a plain value (an integer, a double).
  template <typename T>
  Hasher& update_value(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "hash plain values only");
    return update(&value, sizeof value);
  }
  uint64_t digest() const { return XXH3_64bits_digest(state_); }
  std::string hex() const { return fmt::format("{:016x}", digest()); }

 private:
  XXH3_state_t* state_;
};

// XXH3-64 of one byte range, and as hex.
inline uint64_t hash64(const void* data, size_t size, uint64_t seed = 0) { return XXH3_64bits_withSeed(data, size, seed); }
inline std::string hash_hex(std::string_view bytes) { return fmt::format("{:016x}", hash64(bytes.data(), bytes.size())); }

}  // namespace sana
