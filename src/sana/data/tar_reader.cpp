#include "sana/data/tar_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "sana/data/dataset_index.h"

namespace sana::data {

namespace {

constexpr size_t kBlock = 512;

// Reads `n` bytes; false at a short read.
bool read_exact(std::FILE* f, char* out, size_t n) { return std::fread(out, 1, n, f) == n; }

// An octal field (NUL or space terminated), or GNU's base-256 for big sizes; -1 if invalid.
int64_t number_field(const char* p, size_t n) {
  if ((static_cast<unsigned char>(p[0]) & 0x80) != 0) {
    uint64_t v = static_cast<unsigned char>(p[0]) & 0x7F;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55 != 0) return -1;
      v = v << 8 | static_cast<unsigned char>(p[i]);
    }
    return static_cast<int64_t>(v);
  }
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  int64_t v = 0;
  bool digits = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60 != 0) return -1;
    v = v * 8 + (p[i] - '0');
    digits = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return -1;
  }
  return digits ? v : -1;
}

bool checksum_ok(const char* h) {
  const int64_t stored = number_field(h + 148, 8);
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : static_cast<unsigned char>(h[i]);
    signed_sum += in_field ? ' ' : static_cast<signed char>(h[i]);
  }
  return stored == unsigned_sum || stored == signed_sum;
}

std::string c_string(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// The `path` record of a pax extended header ("<len> path=<value>\n" records), or "".
std::string pax_path(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    size_t len = 0;
    for (size_t i = at; i < space; ++i) {
      if (records[i] < '0' || records[i] > '9' || len > records.size()) return "";
      len = len * 10 + static_cast<size_t>(records[i] - '0');
    }
    if (len <= space - at || at + len > records.size()) break;
    const std::string record = records.substr(space + 1, at + len - space - 2);  // without "\n"
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += len;
  }
  return "";
}

// Lists the members of the archive open as `f` (a file, or memory through fmemopen).
void scan(std::FILE* f, const std::string& name, const std::function<void(const TarMember&)>& visit) {
  std::fseek(f, 0, SEEK_END);
  const uint64_t file_size = static_cast<uint64_t>(std::max(0L, std::ftell(f)));
  std::fseek(f, 0, SEEK_SET);
  char h[kBlock];
  std::string long_name;
  uint64_t at = 0;  // of the next header
  for (;;) {
    if (at > 0 && at >= file_size) return;  // no end-of-archive blocks: Python's tarfile accepts it too
    if (std::fseek(f, static_cast<long>(at), SEEK_SET) != 0 || !read_exact(f, h, kBlock)) {
      if (at == 0) throw IndexError(fmt::format("'{}' is empty or not a tar archive", name));
      throw IndexError(fmt::format("'{}' ends inside a header at byte {} (truncated shard?)", name, at));
    }
    if (std::all_of(h, h + kBlock, [](char c) { return c == '\0'; })) return;  // the end
    if (!checksum_ok(h)) {
      if (at == 0 && (static_cast<unsigned char>(h[0]) == 0x1f || h[0] == 'B' || h[0] == '\xfd')) {
        throw IndexError(fmt::format("'{}' is compressed; shards must be plain (uncompressed) .tar", name));
      }
      throw IndexError(fmt::format("'{}': damaged tar header at byte {} (checksum mismatch)", name, at));
    }
    const int64_t size = number_field(h + 124, 12);
    if (size < 0) throw IndexError(fmt::format("'{}': damaged tar header at byte {} (size field)", name, at));
    const uint64_t data = at + kBlock;
    const uint64_t padded = (static_cast<uint64_t>(size) + kBlock - 1) / kBlock * kBlock;
    const char type = h[156];
    if (type == 'L' || type == 'x') {
      if (size > (1 << 20)) throw IndexError(fmt::format("'{}': a {}-byte name record at byte {}", name, size, at));
      std::vector<char> body(static_cast<size_t>(size));
      if (!read_exact(f, body.data(), body.size())) {
        throw IndexError(fmt::format("'{}' ends inside the member at byte {} (truncated shard?)", name, at));
      }
      const std::string text(body.data(), static_cast<size_t>(size));
      const std::string path = type == 'L' ? c_string(text.data(), text.size()) : pax_path(text);
      if (!path.empty()) long_name = path;
      at = data + padded;
      continue;
    }
    if (static_cast<uint64_t>(size) > file_size - data) {
      throw IndexError(fmt::format("'{}' ends inside member '{}' at byte {} (truncated shard?)", name,
                                   long_name.empty() ? c_string(h, 100) : long_name, at));
    }
    if (type == '0' || type == '\0' || type == '7') {
      TarMember m;
      if (!long_name.empty()) {
        m.name = long_name;
      } else {
        const std::string prefix = std::memcmp(h + 257, "ustar", 5) == 0 ? c_string(h + 345, 155) : "";
        m.name = prefix.empty() ? c_string(h, 100) : prefix + "/" + c_string(h, 100);
      }
      m.offset = data;
      m.size = static_cast<uint64_t>(size);
      visit(m);
    }
    long_name.clear();
    at = data + padded;
  }
}

}  // namespace

void scan_tar(const std::string& path, const std::function<void(const TarMember&)>& visit) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw IndexError(fmt::format("cannot open shard '{}'", path));
  scan(f.get(), path, visit);
}

void scan_tar_bytes(const char* data, size_t size, const std::string& name,
                    const std::function<void(const TarMember&)>& visit) {
  if (size == 0) throw IndexError(fmt::format("'{}' is empty or not a tar archive", name));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(fmemopen(const_cast<char*>(data), size, "rb"), &std::fclose);
  if (!f) throw IndexError(fmt::format("cannot read '{}'", name));
  scan(f.get(), name, visit);
}

}  // namespace sana::data
