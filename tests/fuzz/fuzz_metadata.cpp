// The JSONL and CSV metadata parsers: the first byte picks the format, the rest is the
// file. Every row is read; a bad line throws IndexError naming the file and line.
#include <cstdint>

#include "fuzz_support.h"
#include "sana/data/index_sources.h"
#include "sana/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string path = sana::fuzz::as_file(data + 1, size - 1, (data[0] & 1) ? ".csv" : ".jsonl");
  try {
    auto source = sana::data::open_source(path);
    sana::data::IndexRow row;
    for (int rows = 0; rows < 100000 && source->next(row); ++rows) {
    }
  } catch (const sana::Error&) {
  }
  return 0;
}
