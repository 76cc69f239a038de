// Precomputed-feature containers from elsewhere: .npy headers, .npz (zip) archives and tar
// shards. A parsed array must lie inside its input with elements x itemsize bytes; an
// archive member must extract to the size its directory claims; a tar member must lie
// inside the shard. Any other outcome than success or sana::Error is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "sana/data/array_file.h"
#include "sana/data/tar_reader.h"

namespace {

void check_npy(const char* data, size_t size, const std::string& name) {
  try {
    const auto a = sana::data::parse_npy(data, size, name);
    int64_t count = 1;
    for (const int64_t d : a.shape) count *= d;
    if (a.bytes != static_cast<size_t>(count) * static_cast<size_t>(a.itemsize)) std::abort();
    if (a.data < data || a.data + a.bytes > data + size) std::abort();
  } catch (const sana::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const char* data = reinterpret_cast<const char*>(bytes);
  check_npy(data, size, "fuzz.npy");
  try {
    const auto npz = sana::data::parse_npz(data, size, "fuzz.npz");
    for (size_t i = 0; i < npz.names.size(); ++i) check_npy(npz.bytes[i].data(), npz.bytes[i].size(), "member");
  } catch (const sana::Error&) {
  }
  try {
    sana::data::scan_tar_bytes(data, size, "fuzz.tar", [&](const sana::data::TarMember& m) {
      if (m.offset > size || m.size > size - m.offset) std::abort();
    });
  } catch (const sana::Error&) {
  }
  return 0;
}
