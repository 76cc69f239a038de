// The wire format of the run's key-value store (server: store_server.h, client:
// store_client.h). Plain bytes; never includes torch.
//
// Every message is a frame: a 4-byte little-endian length, then that many bytes of body.
// A request body is one op byte followed by fields; a reply body is one status byte
// followed by fields. A field is a 4-byte little-endian length and its bytes; integers
// travel as 8-byte little-endian fields. The first request on a connection must be
// `hello` with the protocol name and the run's token; the server answers nothing else
// before it and closes a connection that sends anything else, a wrong token, or a frame
// over kMaxFrame.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sana::dist::store_wire {

constexpr const char* kProtocol = "sana-store/2";  // 2: `age`
constexpr uint32_t kMaxFrame = 64u << 20;  // 64 MiB: far above any key or value we write

enum class Op : uint8_t {
  hello = 1,
  set = 2,
  get = 3,          // key, timeout_ms: parked until the key exists or the timeout
  add = 4,          // key, delta -> new value (stored as decimal text, as c10d does)
  check = 5,        // keys... -> 1 if all exist
  compare_set = 6,  // key, expected, desired -> the value now held
  erase = 7,        // key -> 1 if it existed
  num_keys = 8,
  wait = 9,  // timeout_ms, keys...: parked until all exist or the timeout
  age = 10,  // key -> milliseconds since the store host last saw it written; -1: no such key
};

enum class Status : uint8_t { ok = 0, timeout = 1, error = 2 };

using Bytes = std::vector<uint8_t>;

// Builds a frame (length included).
class FrameWriter {
 public:
  explicit FrameWriter(uint8_t head) { buf_.resize(4); buf_.push_back(head); }
  FrameWriter& field(const void* data, size_t size);
  FrameWriter& field(const std::string& s) { return field(s.data(), s.size()); }
  FrameWriter& field(const Bytes& b) { return field(b.data(), b.size()); }
  FrameWriter& integer(int64_t v);
  // The finished frame: the length is filled in.
  Bytes take();

 private:
  Bytes buf_;
};

// Reads the fields of one frame body (after the length). Every accessor returns nullopt
// when the body is too short: a malformed frame, never an out-of-bounds read.
class FrameReader {
 public:
  FrameReader(const uint8_t* body, size_t size) : p_(body), end_(body + size) {}
  std::optional<uint8_t> head();
  std::optional<std::string> text();
  std::optional<Bytes> bytes();
  std::optional<int64_t> integer();
  bool done() const { return p_ == end_; }

 private:
  std::optional<std::pair<const uint8_t*, uint32_t>> raw();
  const uint8_t* p_;
  const uint8_t* end_;
};

uint32_t read_le32(const uint8_t* p);

// The decimal text c10d's stores keep for counters.
std::string counter_text(int64_t v);
// Parses counter text; nullopt when it is not an integer.
std::optional<int64_t> parse_counter(const Bytes& b);

}  // namespace sana::dist::store_wire
