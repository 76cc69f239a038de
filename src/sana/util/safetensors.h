// The safetensors format (an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw bytes), written and read here
// because Debian has no C++ package for it. Python reads these files with numpy alone
// (read_safetensors in tests/reference/sana_reference.py) or with the safetensors package.
#pragma once

#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sana/util/safetensors_header.h"

namespace sana {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes CPU copies of `tensors` (F64, F32, F16, BF16, I64, I32, U8, BOOL) in the given
// order and returns where each landed (byte ranges in the file). Throws SafetensorsError
// when the file cannot be written.
std::vector<SafetensorsEntry> write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in file order
  std::map<std::string, std::string> metadata;
  torch::Tensor get(const std::string& name) const;  // throws SafetensorsError
};

// The LibTorch type of a safetensors dtype the header reader takes (F64, F32, F16, BF16,
// I64, I32, U8, BOOL); a SafetensorsError for any other.
torch::ScalarType safetensors_scalar_type(const std::string& dtype);

// Reads every tensor; a truncated or malformed file is a SafetensorsError naming it.
SafetensorsFile read_safetensors(const std::string& path);
// The same from a file's bytes already in memory (`path` names it in errors).
SafetensorsFile parse_safetensors(const std::vector<char>& bytes, const std::string& path);

}  // namespace sana
