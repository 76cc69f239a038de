#include "sana/data/file_ref.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

namespace sana::data {

namespace {

// Digits only, no overflow; false otherwise.
bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 19) return false;
  out = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + static_cast<uint64_t>(c - '0');
  }
  return true;
}

template <class Bytes>
std::string read_into(const std::string& path, Bytes& out) {
  const FileRef ref = parse_file_ref(path);
  std::error_code ec;
  // Not only regular files: a read that blocks (a FIFO, a hung network file system) is the
  // loader's timeout to handle, not something to guess from the file type.
  if (!std::filesystem::exists(ref.file, ec)) return "no such file";
  if (std::filesystem::is_directory(ref.file, ec)) return "a folder, not a file";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(ref.file.c_str(), "rb"), &std::fclose);
  if (!f) return "cannot open the file";
  uint64_t size = ref.size;
  if (!ref.in_tar()) {
    if (std::fseek(f.get(), 0, SEEK_END) != 0) return "cannot seek in the file";
    const long end = std::ftell(f.get());
    if (end < 0) return "cannot seek in the file";
    size = static_cast<uint64_t>(end);
  }
  if (ref.offset > static_cast<uint64_t>(std::numeric_limits<long>::max()) ||
      std::fseek(f.get(), static_cast<long>(ref.offset), SEEK_SET) != 0) {
    return "cannot seek in the file";
  }
  out.resize(size);
  const size_t got = size == 0 ? 0 : std::fread(out.data(), 1, size, f.get());
  if (got != size) {
    out.resize(got);
    return ref.in_tar() ? fmt::format("the shard ends {} bytes into member '{}' of {} bytes (truncated shard?)",
                                      got, ref.member, size)
                        : "the file changed size while being read";
  }
  return "";
}

}  // namespace

FileRef parse_file_ref(const std::string& path) {
  FileRef ref;
  ref.file = path;
  const size_t at = path.rfind('@');
  const size_t plus = path.rfind('+');
  const size_t hash = path.rfind(".tar#", at);
  if (at == std::string::npos || plus == std::string::npos || plus < at || hash == std::string::npos) return ref;
  uint64_t offset = 0, size = 0;
  if (!parse_u64(path.substr(at + 1, plus - at - 1), offset) || !parse_u64(path.substr(plus + 1), size)) return ref;
  const std::string member = path.substr(hash + 5, at - hash - 5);
  if (member.empty()) return ref;
  ref.file = path.substr(0, hash + 4);
  ref.member = member;
  ref.offset = offset;
  ref.size = size;
  return ref;
}

std::string member_ref(const std::string& shard, const std::string& member, uint64_t offset, uint64_t size) {
  return fmt::format("{}#{}@{}+{}", shard, member, offset, size);
}

std::string format_name(const std::string& path) {
  const FileRef ref = parse_file_ref(path);
  return ref.in_tar() ? ref.member : path;
}

std::string read_ref(const std::string& path, std::vector<char>& out) { return read_into(path, out); }
std::string read_ref(const std::string& path, std::vector<unsigned char>& out) { return read_into(path, out); }

}  // namespace sana::data
