// The safetensors header (weights, checkpoints and feature files come from elsewhere): a
// parsed header must describe ranges inside the input whose sizes match shape x dtype,
// since the readers allocate and copy on its word alone.
#include <cstdint>
#include <cstdlib>

#include "sana/util/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto header = sana::parse_safetensors_header(reinterpret_cast<const char*>(data), size, "fuzz.safetensors");
    for (const auto& e : header.entries) {
      uint64_t bytes = sana::safetensors_element_size(e.dtype);
      for (const int64_t d : e.shape) bytes *= static_cast<uint64_t>(d);
      if (e.begin > e.end || e.end > size || e.end - e.begin != bytes) std::abort();
    }
  } catch (const sana::Error&) {
  }
  return 0;
}
