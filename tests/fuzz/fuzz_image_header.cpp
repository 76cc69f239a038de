// Image sizes from headers alone (JPEG with EXIF, PNG, GIF, BMP, WebP): never throws;
// a bad file is a result with a reason.
#include <cstdint>

#include "fuzz_support.h"
#include "sana/data/image_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sana::fuzz::as_file(data, size, ".img");
  const auto got = sana::data::read_image_size(path);
  if (got.ok && (got.width <= 0 || got.height <= 0)) __builtin_trap();  // "ok" means a usable size
  return 0;
}
