// NumPy's .npy and .npz files parsed without torch. Precomputed features come in them:
// upstream Sana stores a latent as `<key>.npy` and caption features as `<key>.npz` holding
// `caption_feature` (1, T, C) and optionally `attention_mask` (1, T). An .npz is a zip
// archive of .npy members, stored (np.savez) or deflated (np.savez_compressed), with zip64
// fields since NumPy writes every member with them. Reads only; every malformed input is an
// ArrayFileError naming the file, never a crash or an allocation the input did not pay for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sana/util/error.h"

namespace sana::data {

class ArrayFileError : public sana::RunError {
 public:
  explicit ArrayFileError(const std::string& what) : RunError(what, "tensor file error") {}
};

// One .npy array: little-endian, C order. `data` points into the buffer it was parsed from.
struct NpyArray {
  char kind = 'f';   // 'f' float, 'i' signed integer, 'u' unsigned integer, 'b' bool
  int itemsize = 4;  // bytes per element
  std::vector<int64_t> shape;
  const char* data = nullptr;
  size_t bytes = 0;  // elements x itemsize; the buffer holds at least this many
  int64_t elements() const { return static_cast<int64_t>(bytes) / itemsize; }
};

// Parses a .npy file's bytes; `name` names it in errors. Big-endian, Fortran order, object
// and structured dtypes, and data shorter than the shape are errors saying so.
NpyArray parse_npy(const char* data, size_t size, const std::string& name);

struct ZipMember {
  std::string name;
  uint64_t header_offset = 0;  // of the local file header
  uint64_t compressed = 0;     // bytes stored
  uint64_t size = 0;           // bytes once extracted
  uint16_t method = 0;         // 0 stored, 8 deflate
  uint32_t crc = 0;
};

// The members of a zip archive, from its central directory (zip64 included).
std::vector<ZipMember> list_zip(const char* data, size_t size, const std::string& name);

// A member's bytes, inflated when deflated, CRC checked. Refuses members that would
// extract to more than `max_bytes`.
std::string extract_zip_member(const char* data, size_t size, const ZipMember& member,
                               const std::string& name, uint64_t max_bytes = uint64_t{1} << 32);

// The arrays of an .npz file: member names without ".npy", with their extracted bytes.
struct NpzFile {
  std::vector<std::string> names;  // in archive order
  std::vector<std::string> bytes;  // the .npy file of each
  // The index of array `key`, or -1.
  int find(const std::string& key) const;
  NpyArray array(int i, const std::string& name) const;
};
NpzFile parse_npz(const char* data, size_t size, const std::string& name);

}  // namespace sana::data
