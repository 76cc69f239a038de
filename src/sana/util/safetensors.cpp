#include "sana/util/safetensors.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace sana {

namespace {

const std::vector<std::pair<torch::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, const char*>> names = {
      {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"},
      {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"}, {torch::kInt32, "I32"},
      {torch::kUInt8, "U8"},     {torch::kBool, "BOOL"}};
  return names;
}

}  // namespace

torch::ScalarType safetensors_scalar_type(const std::string& dtype) {
  const auto& names = dtype_names();
  const auto d = std::find_if(names.begin(), names.end(), [&](const auto& x) { return dtype == x.second; });
  if (d == names.end()) throw SafetensorsError(fmt::format("dtype {} is not one this reader takes", dtype));
  return d->first;
}

std::vector<SafetensorsEntry> write_safetensors(const std::string& path, const NamedTensors& tensors,
                                                const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  std::vector<SafetensorsEntry> placed;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const auto& names = dtype_names();
    const auto it = std::find_if(names.begin(), names.end(),
                                 [&](const auto& n) { return n.first == tensor.scalar_type(); });
    if (it == names.end()) {
      throw SafetensorsError(fmt::format("'{}': tensor '{}' has a dtype safetensors cannot hold here",
                                         path, name));
    }
    if (header.contains(name)) throw SafetensorsError(fmt::format("'{}': tensor '{}' twice", path, name));
    auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
    header[name] = {{"dtype", it->second}, {"shape", cpu.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    placed.push_back({name, it->second, cpu.sizes().vec(), offset, offset + bytes});
    offset += bytes;
    data.push_back(std::move(cpu));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw SafetensorsError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : data) {
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  }
  out.flush();
  if (!out) throw SafetensorsError(fmt::format("writing '{}' failed: {}", path, std::strerror(errno)));
  const uint64_t data_start = 8 + n;
  for (auto& e : placed) {
    e.begin += data_start;
    e.end += data_start;
  }
  return placed;
}

torch::Tensor SafetensorsFile::get(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw SafetensorsError(fmt::format("no tensor '{}'", name));
}

namespace {

SafetensorsFile parse_bytes(const char* b, size_t size, const std::string& path) {
  const SafetensorsHeader header = parse_safetensors_header(b, size, path);
  SafetensorsFile file;
  file.metadata = header.metadata;
  for (const auto& e : header.entries) {
    // The header checked the dtype and that the range holds exactly shape x dtype bytes.
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(safetensors_scalar_type(e.dtype)));
    std::memcpy(t.data_ptr(), b + e.begin, e.end - e.begin);
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

}  // namespace

// The file mapped, each tensor copied once out of the mapping: no second copy of the file in
// memory (a Gemma-2 shard is gigabytes), the kernel reading ahead as the copies go.
SafetensorsFile read_safetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SafetensorsError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw SafetensorsError(fmt::format("cannot read '{}': {}", path, std::strerror(err)));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return parse_bytes(nullptr, 0, path);  // the header's own error for a file too short
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw SafetensorsError(fmt::format("cannot map '{}': {}", path, std::strerror(err)));
  ::madvise(map, size, MADV_SEQUENTIAL);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  return parse_bytes(static_cast<const char*>(map), size, path);
}

SafetensorsFile parse_safetensors(const std::vector<char>& b, const std::string& path) {
  return parse_bytes(b.data(), b.size(), path);
}

}  // namespace sana
