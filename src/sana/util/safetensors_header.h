// The safetensors header (an 8-byte little-endian length, then a JSON object naming each
// tensor's dtype, shape and byte range in the data that follows), parsed and checked
// without tensors: every range lies inside the file and holds exactly shape x dtype
// bytes, so a reader may allocate and copy without further checks. Both readers (weights
// and checkpoints in util/safetensors.h, one feature tensor in data/tensor_file.h) and the
// fuzz target share it. No torch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sana/util/error.h"

namespace sana {

class SafetensorsError : public sana::RunError {
 public:
  explicit SafetensorsError(const std::string& what) : RunError(what, "safetensors error") {}
};

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // F64, F32, F16, BF16, I64, I32, U8, BOOL
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range in the file (not in the data section)
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in header order
  std::map<std::string, std::string> metadata;
};

// Bytes per element of a dtype this reader knows; 0 for any other.
size_t safetensors_element_size(const std::string& dtype);

// Parses and checks the header of a file's `size` bytes (`path` names it in errors).
// Throws SafetensorsError naming the file and the tensor for anything malformed,
// truncated, of another dtype, or with a shape whose bytes do not match its range.
SafetensorsHeader parse_safetensors_header(const char* data, size_t size, const std::string& path);

}  // namespace sana
