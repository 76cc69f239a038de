// The dataset index reader (a memory-mapped binary file that may be damaged or
// hostile): opening it, every record and its text, and the fingerprint.
#include <algorithm>
#include <cstdint>

#include "fuzz_support.h"
#include "sana/data/dataset_index.h"
#include "sana/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sana::fuzz::as_file(data, size, ".sanaidx");
  try {
    const auto index = sana::data::DatasetIndex::open(path);
    const uint64_t n = std::min<uint64_t>(index.size(), 4096);
    for (uint64_t i = 0; i < n; ++i) {
      (void)index.record(i);
      try {
        (void)index.text(i);
      } catch (const sana::Error&) {
      }
    }
    (void)index.fingerprint();
  } catch (const sana::Error&) {
  }
  return 0;
}
