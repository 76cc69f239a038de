#include "sana/data/tensor_file.h"

#include <fmt/format.h>

#include <fstream>
#include <regex>
#include <vector>

#include "sana/util/safetensors.h"

namespace sana::data {

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TensorFileError(fmt::format("cannot open '{}'", path));
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

torch::Tensor from_bytes(const char* data, size_t available, torch::ScalarType type,
                         const std::vector<int64_t>& shape, const std::string& path) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count) || count > (int64_t{1} << 40)) {
      throw TensorFileError(fmt::format("'{}' has an impossible shape", path));
    }
  }
  const size_t need = static_cast<size_t>(count) * torch::elementSize(type);
  if (need > available) {
    throw TensorFileError(fmt::format("'{}' is truncated: {} bytes of data for a {} tensor of "
                                      "{} bytes",
                                      path, available, fmt::join(shape, "x"), need));
  }
  auto t = torch::empty(shape, torch::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), data, need);
  return t.to(torch::kFloat32);
}

torch::Tensor read_npy(const std::string& path, const std::vector<char>& b) {
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) {
    throw TensorFileError(fmt::format("'{}' is not a .npy file", path));
  }
  const int major = static_cast<unsigned char>(b[6]);
  const size_t len_bytes = major == 1 ? 2 : 4;
  size_t header_len = static_cast<unsigned char>(b[8]) | static_cast<unsigned char>(b[9]) << 8;
  if (len_bytes == 4) {
    if (b.size() < 12) throw TensorFileError(fmt::format("'{}' is truncated", path));
    header_len |= static_cast<size_t>(static_cast<unsigned char>(b[10])) << 16 |
                  static_cast<size_t>(static_cast<unsigned char>(b[11])) << 24;
  }
  const size_t start = 8 + len_bytes;
  if (header_len > (1 << 20) || header_len > b.size() - start) {
    throw TensorFileError(fmt::format("'{}' is truncated or has a damaged header", path));
  }
  const std::string header(b.data() + start, header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr':\s*'([<|>]?)([a-z])(\d+)')"))) {
    throw TensorFileError(fmt::format("'{}': no dtype in the .npy header", path));
  }
  if (m[1] == ">") throw TensorFileError(fmt::format("'{}' is big-endian; save it little-endian", path));
  const std::string kind = m[2].str() + m[3].str();
  torch::ScalarType type;
  if (kind == "f4") type = torch::kFloat32;
  else if (kind == "f2") type = torch::kFloat16;
  else if (kind == "f8") type = torch::kFloat64;
  else throw TensorFileError(fmt::format("'{}' holds dtype {}; latents must be floating point", path, kind));
  if (header.find("'fortran_order': True") != std::string::npos) {
    throw TensorFileError(fmt::format("'{}' is in Fortran order; save it C-contiguous", path));
  }
  if (!std::regex_search(header, m, std::regex(R"('shape':\s*\(([^)]*)\))"))) {
    throw TensorFileError(fmt::format("'{}': no shape in the .npy header", path));
  }
  std::vector<int64_t> shape;
  const std::string dims = m[1];
  const std::regex num(R"(\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    if (it->str().size() > 12) throw TensorFileError(fmt::format("'{}' has an impossible shape", path));
    shape.push_back(std::stoll(it->str()));
  }
  return from_bytes(b.data() + start + header_len, b.size() - start - header_len, type, shape, path);
}

torch::Tensor read_safetensors(const std::string& path, const std::vector<char>& b,
                               const std::string& key) {
  SafetensorsHeader header;
  try {
    header = parse_safetensors_header(b.data(), b.size(), path);
  } catch (const SafetensorsError& e) {
    throw TensorFileError(e.what());  // a damaged feature file is a bad sample
  }
  const SafetensorsEntry* entry = nullptr;
  for (const auto& e : header.entries) {
    if (key.empty()) {
      if (entry != nullptr) throw TensorFileError(fmt::format("'{}' holds several tensors; name one", path));
      entry = &e;
    } else if (e.name == key) {
      entry = &e;
    }
  }
  if (entry == nullptr) throw TensorFileError(fmt::format("'{}' has no tensor '{}'", path, key));
  const torch::ScalarType type = safetensors_scalar_type(entry->dtype);  // the header checked it
  if (!torch::isFloatingType(type)) {
    throw TensorFileError(fmt::format("'{}': tensor '{}' has dtype {}; features must be floating point", path,
                                      entry->name, entry->dtype));
  }
  return from_bytes(b.data() + entry->begin, entry->end - entry->begin, type, entry->shape, path);
}

}  // namespace

torch::Tensor read_tensor_file_unchecked(const std::string& path, const std::string& key);

torch::Tensor read_tensor_file(const std::string& path, const std::string& key) {
  try {
    return read_tensor_file_unchecked(path, key);
  } catch (const TensorFileError&) {
    throw;
  } catch (const std::exception& e) {
    // A damaged file must never be more than a bad sample (JSON type errors, c10 errors).
    throw TensorFileError(fmt::format("'{}' is damaged: {}", path, e.what()));
  }
}

torch::Tensor read_tensor_file_unchecked(const std::string& path, const std::string& key) {
  const auto bytes = read_all(path);
  if (bytes.empty()) throw TensorFileError(fmt::format("'{}' is empty", path));
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) return read_npy(path, bytes);
  if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) {
    return read_safetensors(path, bytes, key);
  }
  throw TensorFileError(fmt::format("'{}' is neither .npy nor .safetensors", path));
}

}  // namespace sana::data
