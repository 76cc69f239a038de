#include "sana/util/safetensors_header.h"

#include <fmt/format.h>

#include <cstdint>

#include <nlohmann/json.hpp>

namespace sana {

size_t safetensors_element_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

namespace {

// A shape's byte count, or an error when a dimension is negative or the count overflows
// (a hostile header must never reach an allocation).
uint64_t byte_count(const std::vector<int64_t>& shape, size_t element_size, const std::string& path,
                    const std::string& name) {
  uint64_t bytes = element_size;
  for (const int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      throw SafetensorsError(fmt::format("'{}': tensor '{}' has an impossible shape", path, name));
    }
  }
  return bytes;
}

// A JSON array of whole numbers, read without nlohmann's casts: those convert a float
// (1e300) or a negative number straight to the integer type, which is undefined behaviour.
// Unsigned values above INT64_MAX and any fraction are refused here.
std::vector<int64_t> integer_list(const nlohmann::ordered_json& j, const char* key, const std::string& path,
                                  const std::string& name) {
  const auto& list = j.at(key);
  if (!list.is_array()) {
    throw SafetensorsError(fmt::format("'{}': tensor '{}': '{}' is not a list", path, name, key));
  }
  std::vector<int64_t> out;
  out.reserve(list.size());
  for (const auto& v : list) {
    if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
      out.push_back(static_cast<int64_t>(v.get<uint64_t>()));
    } else if (v.is_number_integer() && !v.is_number_unsigned()) {
      out.push_back(v.get<int64_t>());
    } else {
      throw SafetensorsError(fmt::format("'{}': tensor '{}': '{}' holds something other than whole numbers", path,
                                         name, key));
    }
  }
  return out;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const char* data, size_t size, const std::string& path) {
  if (size < 8) throw SafetensorsError(fmt::format("'{}' is too short for safetensors", path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(data[i]);
  if (n > size - 8) throw SafetensorsError(fmt::format("'{}' is truncated (header)", path));
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  SafetensorsHeader out;
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(data + 8, data + data_start);
  } catch (const std::exception& e) {
    throw SafetensorsError(fmt::format("'{}': bad safetensors header: {}", path, e.what()));
  }
  if (!header.is_object()) throw SafetensorsError(fmt::format("'{}': the safetensors header is not an object", path));
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    try {
      if (name == "__metadata__") {
        out.metadata = it.value().get<std::map<std::string, std::string>>();
        continue;
      }
      SafetensorsEntry e;
      e.name = name;
      e.dtype = it.value().at("dtype").get<std::string>();
      const size_t element = safetensors_element_size(e.dtype);
      if (element == 0) {
        throw SafetensorsError(fmt::format("'{}': tensor '{}' has dtype {}, which this reader does not take", path,
                                           name, e.dtype.substr(0, 16)));
      }
      e.shape = integer_list(it.value(), "shape", path, name);
      const auto off = integer_list(it.value(), "data_offsets", path, name);
      const uint64_t bytes = byte_count(e.shape, element, path, name);
      if (off.size() != 2 || off[0] < 0 || off[1] < off[0] || static_cast<uint64_t>(off[1]) > data_size ||
          static_cast<uint64_t>(off[1] - off[0]) != bytes) {
        throw SafetensorsError(fmt::format("'{}' is truncated or damaged: tensor '{}' does not fit", path, name));
      }
      e.begin = data_start + off[0];
      e.end = data_start + off[1];
      out.entries.push_back(std::move(e));
    } catch (const SafetensorsError&) {
      throw;
    } catch (const std::exception& e) {  // JSON type errors: a field of the wrong kind
      throw SafetensorsError(fmt::format("'{}': bad safetensors header at '{}': {}", path, name.substr(0, 200), e.what()));
    }
  }
  return out;
}

}  // namespace sana
