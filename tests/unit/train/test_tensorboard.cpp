// TensorBoard's file format: CRC-32C and its mask against the standard check values, the
// TFRecord framing, and an event file that parses back into the events written.
#include "catch.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "sana/train/report/tensorboard.h"
#include "tensorboard_event.pb.h"
#include "test_support.h"

using namespace sana::train;

namespace {
uint64_t little_endian(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<size_t>(i)]);
  return v;
}
uint64_t le64(const std::string& b, size_t at) { return little_endian(b, at, 8); }
uint32_t le32(const std::string& b, size_t at) { return static_cast<uint32_t>(little_endian(b, at, 4)); }
}  // namespace

TEST_CASE("CRC-32C and TFRecord framing", "[tensorboard]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);  // the Castagnoli check value
  CHECK(crc32c("", 0) == 0u);
  // Continuing a CRC over a second part gives the CRC of the whole.
  CHECK(crc32c("6789", 4, crc32c("12345", 5)) == 0xE3069283u);
  const std::string data = "hello, tensorboard";
  const std::string r = tfrecord(data);
  REQUIRE(r.size() == data.size() + 16);
  CHECK(le64(r, 0) == data.size());
  CHECK(le32(r, 8) == masked_crc32c(r.data(), 8));
  CHECK(r.substr(12, data.size()) == data);
  CHECK(le32(r, 12 + data.size()) == masked_crc32c(data.data(), data.size()));
  const uint32_t c = crc32c(data.data(), data.size());
  CHECK(masked_crc32c(data.data(), data.size()) == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST_CASE("an event file holds the version, then the scalars and images written", "[tensorboard]") {
  sana::test::TempDir dir;
  std::string path;
  {
    EventWriter w(dir.path("tb"));
    path = w.path();
    w.scalars(7, {{"train/loss", 0.25}, {"train/lr", 1e-4}});
    w.image(8, "preview/32x32", std::string("\x89PNG fake", 9), 32, 64);
  }
  CHECK(path.find("events.out.tfevents.") != std::string::npos);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<sana::tensorboard::Event> events;
  for (size_t at = 0; at < bytes.size();) {
    const uint64_t n = le64(bytes, at);
    REQUIRE(at + 16 + n <= bytes.size());
    sana::tensorboard::Event e;
    REQUIRE(e.ParseFromString(bytes.substr(at + 12, n)));
    events.push_back(e);
    at += 16 + n;
  }
  REQUIRE(events.size() == 3);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[1].step() == 7);
  REQUIRE(events[1].summary().value_size() == 2);
  CHECK(events[1].summary().value(0).tag() == "train/loss");
  CHECK(events[1].summary().value(0).simple_value() == 0.25f);
  CHECK(events[2].summary().value(0).image().width() == 64);
  CHECK(events[2].summary().value(0).image().encoded_image_string().size() == 9);
}
