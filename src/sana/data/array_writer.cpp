#include "sana/data/array_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "sana/util/error.h"

namespace sana::data {

namespace {

void put16(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>((v >> 8) & 0xFF));
}

void put32(std::string& out, uint32_t v) {
  put16(out, v & 0xFFFF);
  put16(out, v >> 16);
}

int64_t item_size(const std::string& descr) {
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|')) {
    throw RunError(fmt::format("npy: type '{}' is not a little-endian number type", descr));
  }
  return std::stoll(descr.substr(2));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

std::string npy_bytes(const ArrayToWrite& a) {
  int64_t elements = 1;
  for (int64_t d : a.shape) elements *= d;
  if (static_cast<size_t>(elements * item_size(a.descr)) != a.bytes) {
    throw RunError(fmt::format("npy: {} bytes for shape {} of {}", a.bytes, shape_text(a.shape), a.descr));
  }
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", a.descr, shape_text(a.shape));
  // NumPy pads the header with spaces and a newline so the data starts on a 64-byte boundary.
  const size_t prefix = 10;
  const size_t padded = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(padded - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  put16(out, static_cast<uint32_t>(header.size()));
  out += header;
  out.append(static_cast<const char*>(a.data), a.bytes);
  return out;
}

std::string npz_bytes(const std::vector<ArrayToWrite>& arrays) {
  std::string out, central;
  for (const auto& a : arrays) {
    const std::string member = npy_bytes(a);
    const std::string name = a.name + ".npy";
    if (member.size() >= std::numeric_limits<uint32_t>::max() || out.size() >= std::numeric_limits<uint32_t>::max()) {
      throw RunError(fmt::format("npz: member '{}' or the archive passes 4 GiB (no zip64 here)", name));
    }
    const auto crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(member.data()), static_cast<uInt>(member.size())));
    const auto offset = static_cast<uint32_t>(out.size());
    const auto size = static_cast<uint32_t>(member.size());
    // Local file header: version 2.0, no flags, stored, no time stamp.
    put32(out, 0x04034b50);
    put16(out, 20);
    put16(out, 0);
    put16(out, 0);
    put32(out, 0);  // time and date
    put32(out, crc);
    put32(out, size);
    put32(out, size);
    put16(out, static_cast<uint32_t>(name.size()));
    put16(out, 0);
    out += name;
    out += member;
    // Its central directory entry.
    put32(central, 0x02014b50);
    put16(central, 20);
    put16(central, 20);
    put16(central, 0);
    put16(central, 0);
    put32(central, 0);
    put32(central, crc);
    put32(central, size);
    put32(central, size);
    put16(central, static_cast<uint32_t>(name.size()));
    put16(central, 0);  // extra
    put16(central, 0);  // comment
    put16(central, 0);  // disk
    put16(central, 0);  // internal attributes
    put32(central, 0);  // external attributes
    put32(central, offset);
    central += name;
  }
  const auto directory_at = static_cast<uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(arrays.size()));
  put16(out, static_cast<uint32_t>(arrays.size()));
  put32(out, static_cast<uint32_t>(central.size()));
  put32(out, directory_at);
  put16(out, 0);
  return out;
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw RunError(fmt::format("cannot write '{}' ({} failed: {}); check the folder's space and permissions", path,
                               what, reason));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

}  // namespace sana::data
