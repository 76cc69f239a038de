// The safetensors header checks, without tensors: a hostile header is an error naming the
// file and tensor before anything is allocated.
#include "catch.h"

#include <cstdint>
#include <string>

#include "sana/util/safetensors_header.h"

namespace {

// A file of the given JSON header (padded to 8 bytes) followed by `data_bytes` zero bytes.
std::string file_of(std::string header, size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

sana::SafetensorsHeader parse(const std::string& f) {
  return sana::parse_safetensors_header(f.data(), f.size(), "w.safetensors");
}

}  // namespace

TEST_CASE("a well-formed header gives each tensor's range in the file", "[safetensors]") {
  const auto f = file_of(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("a":{"dtype":"BF16","shape":[],"data_offsets":[24,26]}})",
      26);
  const auto h = parse(f);
  REQUIRE(h.entries.size() == 2);
  CHECK(h.entries[0].name == "b");  // file order, not sorted
  CHECK(h.entries[0].end - h.entries[0].begin == 24);
  CHECK(h.entries[1].end == f.size());
  CHECK(h.metadata.at("format") == "pt");
}

TEST_CASE("hostile or damaged headers are errors naming the file, never allocations", "[safetensors]") {
  struct Case {
    const char* header;
    size_t data_bytes;
    const char* error;
  };
  const Case cases[] = {
      // A shape whose byte count overflows 64 bits, and one that is merely huge.
      {R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
       "w.safetensors': tensor 'x' has an impossible shape"},
      {R"({"x":{"dtype":"F32","shape":[100000,100000],"data_offsets":[0,16]}})", 16, "tensor 'x' does not fit"},
      {R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "impossible shape"},
      {R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "truncated or damaged: tensor 'x'"},
      {R"({"x":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8, "dtype C64"},
      {R"({"x":{"dtype":"F32","shape":"big","data_offsets":[0,4]}})", 4, "tensor 'x': 'shape' is not a list"},
      // Numbers that are not whole, or beyond int64: refused, never cast (that cast is undefined).
      {R"({"x":{"dtype":"F32","shape":[1e300],"data_offsets":[0,4]}})", 4,
       "'shape' holds something other than whole numbers"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-1.5e300,4]}})", 4,
       "'data_offsets' holds something other than whole numbers"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "tensor 'x' does not fit"},
      {R"({"x":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]}})", 1, "whole numbers"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":0}})", 4, "'data_offsets' is not a list"},
      {R"([1,2,3])", 0, "not an object"},
  };
  for (const auto& c : cases) {
    INFO(c.header);
    CHECK_THROWS_WITH(parse(file_of(c.header, c.data_bytes)), Catch::Contains(c.error));
  }
  CHECK_THROWS_WITH(parse(std::string("\xff\xff\xff\xff\0\0\0\0{}", 10)), Catch::Contains("truncated (header)"));
  CHECK_THROWS_WITH(parse("short"), Catch::Contains("too short"));
}
