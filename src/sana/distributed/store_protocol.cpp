#include "sana/distributed/store_protocol.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace sana::dist::store_wire {

namespace {

void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

uint32_t read_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

FrameWriter& FrameWriter::field(const void* data, size_t size) {
  const size_t at = buf_.size();
  buf_.resize(at + 4 + size);
  put_le32(buf_.data() + at, static_cast<uint32_t>(size));
  if (size > 0) std::memcpy(buf_.data() + at + 4, data, size);
  return *this;
}

FrameWriter& FrameWriter::integer(int64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
  return field(b, 8);
}

Bytes FrameWriter::take() {
  put_le32(buf_.data(), static_cast<uint32_t>(buf_.size() - 4));
  return std::move(buf_);
}

std::optional<uint8_t> FrameReader::head() {
  if (p_ == end_) return std::nullopt;
  return *p_++;
}

std::optional<std::pair<const uint8_t*, uint32_t>> FrameReader::raw() {
  if (end_ - p_ < 4) return std::nullopt;
  const uint32_t n = read_le32(p_);
  if (static_cast<size_t>(end_ - p_ - 4) < n) return std::nullopt;
  const uint8_t* at = p_ + 4;
  p_ = at + n;
  return std::make_pair(at, n);
}

std::optional<std::string> FrameReader::text() {
  auto r = raw();
  if (!r) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(r->first), r->second);
}

std::optional<Bytes> FrameReader::bytes() {
  auto r = raw();
  if (!r) return std::nullopt;
  return Bytes(r->first, r->first + r->second);
}

std::optional<int64_t> FrameReader::integer() {
  auto r = raw();
  if (!r || r->second != 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(r->first[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

std::string counter_text(int64_t v) { return std::to_string(v); }

std::optional<int64_t> parse_counter(const Bytes& b) {
  if (b.empty() || b.size() > 20) return std::nullopt;
  const std::string s(b.begin(), b.end());
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

}  // namespace sana::dist::store_wire
