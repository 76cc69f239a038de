// The run's store as a foreign client would feed it once past the hello: a stream of
// frames, each applied to the key-value state (store_data.h), which must never read out
// of bounds, crash or throw.
#include <cstddef>
#include <cstdint>

#include "sana/distributed/store_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sana::dist::StoreData store;
  size_t at = 0;
  while (size - at >= 4) {
    const uint32_t n = sana::dist::store_wire::read_le32(data + at);
    if (n > size - at - 4) break;
    store.apply(data + at + 4, n);
    at += 4 + n;
  }
  store.apply(data, size);  // the whole input as one body too
  return 0;
}
