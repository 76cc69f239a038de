#include "sana/data/array_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <cstring>
#include <limits>

namespace sana::data {

namespace {

uint16_t le16(const char* p) {
  return static_cast<uint16_t>(static_cast<unsigned char>(p[0]) | static_cast<unsigned char>(p[1]) << 8);
}
uint32_t le32(const char* p) { return le16(p) | static_cast<uint32_t>(le16(p + 2)) << 16; }
uint64_t le64(const char* p) { return le32(p) | static_cast<uint64_t>(le32(p + 4)) << 32; }

// The value text after `'key':` in an .npy header dict, or "" when the key is absent.
std::string header_value(const std::string& header, const char* key) {
  const std::string quoted = std::string("'") + key + "'";
  size_t at = header.find(quoted);
  if (at == std::string::npos) return "";
  at = header.find(':', at + quoted.size());
  if (at == std::string::npos) return "";
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  if (at >= header.size()) return "";
  if (header[at] == '\'') {
    const size_t end = header.find('\'', at + 1);
    return end == std::string::npos ? "" : header.substr(at, end - at + 1);
  }
  if (header[at] == '(') {
    const size_t end = header.find(')', at);
    return end == std::string::npos ? "" : header.substr(at, end - at + 1);
  }
  const size_t end = header.find_first_of(",}", at);
  return header.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& name) {
  std::vector<int64_t> shape;
  int64_t value = -1;
  int digits = 0;
  for (size_t i = 1; i + 1 < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      if (++digits > 12) throw ArrayFileError(fmt::format("'{}' has an impossible shape", name));
      value = (value < 0 ? 0 : value * 10) + (c - '0');
    } else if (c == ',' || c == ' ' || c == 'L') {
      if (value >= 0 && c != 'L') shape.push_back(value);
      if (c != 'L') value = -1, digits = 0;
    } else {
      throw ArrayFileError(fmt::format("'{}': the .npy header's shape {} is not a tuple of sizes", name, text));
    }
  }
  if (value >= 0) shape.push_back(value);
  return shape;
}

}  // namespace

NpyArray parse_npy(const char* b, size_t size, const std::string& name) {
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) {
    throw ArrayFileError(fmt::format("'{}' is not a .npy file", name));
  }
  const int major = static_cast<unsigned char>(b[6]);
  if (major < 1 || major > 3) throw ArrayFileError(fmt::format("'{}': .npy format version {} is unknown", name, major));
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (size < 8 + len_bytes) throw ArrayFileError(fmt::format("'{}' is truncated", name));
  const size_t header_len = len_bytes == 2 ? le16(b + 8) : le32(b + 8);
  const size_t start = 8 + len_bytes;
  if (header_len > (1 << 20) || header_len > size - start) {
    throw ArrayFileError(fmt::format("'{}' is truncated or has a damaged header", name));
  }
  const std::string header(b + start, header_len);
  const std::string descr = header_value(header, "descr");
  // '<f4', '|b1', '<i8': byte order, kind, item size.
  if (descr.size() < 4 || descr.front() != '\'' || descr.back() != '\'') {
    throw ArrayFileError(fmt::format("'{}': no plain dtype in the .npy header (structured or object arrays are not "
                                     "features)", name));
  }
  NpyArray a;
  const char order = descr[1];
  a.kind = descr[2];
  const std::string item = descr.substr(3, descr.size() - 4);
  if (order == '>' ) throw ArrayFileError(fmt::format("'{}' is big-endian; save it little-endian", name));
  if ((order != '<' && order != '|' && order != '=') || item.empty() || item.size() > 1 ||
      std::string("fiub").find(a.kind) == std::string::npos || std::string("1248").find(item[0]) == std::string::npos) {
    throw ArrayFileError(fmt::format("'{}' holds dtype {}: not a number type", name, descr));
  }
  a.itemsize = item[0] - '0';
  if (header_value(header, "fortran_order") == "True") {
    throw ArrayFileError(fmt::format("'{}' is in Fortran order; save it C-contiguous", name));
  }
  const std::string shape = header_value(header, "shape");
  if (shape.size() < 2 || shape.front() != '(') throw ArrayFileError(fmt::format("'{}': no shape in the .npy header", name));
  a.shape = parse_shape(shape, name);
  int64_t count = 1;
  for (const int64_t d : a.shape) {
    if (__builtin_mul_overflow(count, d, &count) || count > (int64_t{1} << 40)) {
      throw ArrayFileError(fmt::format("'{}' has an impossible shape", name));
    }
  }
  a.bytes = static_cast<size_t>(count) * static_cast<size_t>(a.itemsize);
  const size_t available = size - start - header_len;
  if (a.bytes > available) {
    throw ArrayFileError(fmt::format("'{}' is truncated: {} bytes of data for a {} array of {} bytes", name,
                                     available, fmt::join(a.shape, "x"), a.bytes));
  }
  a.data = b + start + header_len;
  return a;
}

std::vector<ZipMember> list_zip(const char* b, size_t size, const std::string& name) {
  // The end of central directory record: 22 bytes plus a comment of up to 65535.
  if (size < 22) throw ArrayFileError(fmt::format("'{}' is not a zip archive (.npz)", name));
  size_t eocd = std::numeric_limits<size_t>::max();
  for (size_t at = size - 22 + 1; at-- > 0 && size - at <= 22 + 65535;) {
    if (le32(b + at) == 0x06054b50) {
      eocd = at;
      break;
    }
  }
  if (eocd == std::numeric_limits<size_t>::max()) {
    throw ArrayFileError(fmt::format("'{}' is not a zip archive (.npz), or it is truncated", name));
  }
  uint64_t entries = le16(b + eocd + 10), cd_size = le32(b + eocd + 12), cd_offset = le32(b + eocd + 16);
  if ((entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) && eocd >= 20 &&
      le32(b + eocd - 20) == 0x07064b50) {
    const uint64_t z64 = le64(b + eocd - 20 + 8);
    if (z64 > size || size - z64 < 56 || le32(b + z64) != 0x06064b50) {
      throw ArrayFileError(fmt::format("'{}': damaged zip64 directory", name));
    }
    entries = le64(b + z64 + 32);
    cd_size = le64(b + z64 + 40);
    cd_offset = le64(b + z64 + 48);
  }
  if (cd_offset > size || cd_size > size - cd_offset || entries > cd_size / 46) {
    throw ArrayFileError(fmt::format("'{}': the zip directory points outside the file (truncated?)", name));
  }
  std::vector<ZipMember> out;
  size_t at = cd_offset;
  const size_t end = cd_offset + cd_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (end - at < 46 || le32(b + at) != 0x02014b50) throw ArrayFileError(fmt::format("'{}': damaged zip directory", name));
    ZipMember m;
    const uint16_t flags = le16(b + at + 8);
    m.method = le16(b + at + 10);
    m.crc = le32(b + at + 16);
    m.compressed = le32(b + at + 20);
    m.size = le32(b + at + 24);
    const size_t name_len = le16(b + at + 28), extra_len = le16(b + at + 30), comment_len = le16(b + at + 32);
    m.header_offset = le32(b + at + 42);
    if (end - at - 46 < name_len + extra_len + comment_len) {
      throw ArrayFileError(fmt::format("'{}': damaged zip directory", name));
    }
    if ((flags & 1) != 0) throw ArrayFileError(fmt::format("'{}' is encrypted", name));
    m.name.assign(b + at + 46, name_len);
    // zip64: the fields that read 0xFFFFFFFF follow in this order in extra field 0x0001.
    for (size_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      const uint16_t id = le16(b + e), len = le16(b + e + 2);
      if (e + 4 + len > at + 46 + name_len + extra_len) break;
      if (id == 0x0001) {
        size_t f = e + 4;
        for (uint64_t* field : {&m.size, &m.compressed, &m.header_offset}) {
          if (*field != 0xFFFFFFFF) continue;
          if (f + 8 > e + 4 + len) throw ArrayFileError(fmt::format("'{}': damaged zip64 field", name));
          *field = le64(b + f);
          f += 8;
        }
      }
      e += 4 + len;
    }
    out.push_back(std::move(m));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

std::string extract_zip_member(const char* b, size_t size, const ZipMember& m, const std::string& name,
                               uint64_t max_bytes) {
  const std::string where = fmt::format("'{}' member '{}'", name, m.name);
  if (m.header_offset > size || size - m.header_offset < 30 || le32(b + m.header_offset) != 0x04034b50) {
    throw ArrayFileError(where + ": damaged local header");
  }
  const uint64_t data = m.header_offset + 30 + le16(b + m.header_offset + 26) + le16(b + m.header_offset + 28);
  if (data > size || m.compressed > size - data) throw ArrayFileError(where + " is truncated");
  if (m.size > max_bytes) throw ArrayFileError(fmt::format("{} would extract to {} bytes", where, m.size));
  std::string out(m.size, '\0');
  if (m.method == 0) {
    if (m.compressed != m.size) throw ArrayFileError(where + ": stored sizes disagree");
    if (m.size > 0) std::memcpy(out.data(), b + data, m.size);
  } else if (m.method == 8) {
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw ArrayFileError(where + ": cannot start inflating");
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(b + data));
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    uint64_t in_left = m.compressed, out_left = m.size;
    int rc = Z_OK;
    while (rc == Z_OK) {  // uInt is 32 bits: feed in slices
      const uInt in_now = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
      const uInt out_now = static_cast<uInt>(std::min<uint64_t>(out_left, 1u << 30));
      z.avail_in = in_now;
      z.avail_out = out_now;
      rc = inflate(&z, Z_NO_FLUSH);
      in_left -= in_now - z.avail_in;
      out_left -= out_now - z.avail_out;
      if (rc == Z_OK && z.avail_in == in_now && z.avail_out == out_now) rc = Z_BUF_ERROR;  // no progress
    }
    inflateEnd(&z);
    if (rc != Z_STREAM_END || out_left != 0) throw ArrayFileError(where + ": damaged compressed data");
  } else {
    throw ArrayFileError(fmt::format("{} uses compression method {}; save it with np.savez or np.savez_compressed",
                                     where, m.method));
  }
  const uLong crc = crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), out.size());
  if (crc != m.crc) throw ArrayFileError(where + ": checksum mismatch (damaged file)");
  return out;
}

int NpzFile::find(const std::string& key) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == key) return static_cast<int>(i);
  }
  return -1;
}

NpyArray NpzFile::array(int i, const std::string& name) const {
  const std::string& b = bytes.at(static_cast<size_t>(i));
  return parse_npy(b.data(), b.size(), name + ":" + names.at(static_cast<size_t>(i)));
}

NpzFile parse_npz(const char* data, size_t size, const std::string& name) {
  NpzFile f;
  uint64_t total = 0;
  for (const ZipMember& m : list_zip(data, size, name)) {
    if (m.name.size() < 4 || m.name.compare(m.name.size() - 4, 4, ".npy") != 0) continue;
    // Deflate expands at most ~1032x: more would be a bomb, not features.
    total += m.size;
    if (m.size > 1032 * (m.compressed + 1) + 1024 || total > (uint64_t{1} << 32)) {
      throw ArrayFileError(fmt::format("'{}' member '{}' claims {} bytes: not a feature file", name, m.name, m.size));
    }
    f.names.push_back(m.name.substr(0, m.name.size() - 4));
    f.bytes.push_back(extract_zip_member(data, size, m, name));
  }
  if (f.names.empty()) throw ArrayFileError(fmt::format("'{}' holds no .npy arrays", name));
  return f;
}

}  // namespace sana::data
