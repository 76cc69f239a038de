// What prepare-features writes: .npy and .npz bytes that the reader (and NumPy, in
// tests/dist/prepare_features.sh) takes back unchanged, headers on 64-byte boundaries as
// NumPy writes them, and files that appear whole or not at all.
#include "catch.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "sana/data/array_file.h"
#include "sana/data/array_writer.h"
#include "test_support.h"

using namespace sana::data;

TEST_CASE("an .npy round-trips through the reader, data 64-byte aligned", "[array_writer]") {
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.0f, 1e-20f, 7.0f};
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{6}, {2, 3}, {1, 2, 3}}) {
    const std::string bytes = npy_bytes({"", "<f4", shape, values.data(), values.size() * sizeof(float)});
    const NpyArray a = parse_npy(bytes.data(), bytes.size(), "x.npy");
    INFO(bytes.substr(10, 70));
    CHECK(a.kind == 'f');
    CHECK(a.itemsize == 4);
    CHECK(a.shape == shape);
    REQUIRE(a.bytes == values.size() * sizeof(float));
    CHECK(std::memcmp(a.data, values.data(), a.bytes) == 0);
    CHECK((a.data - bytes.data()) % 64 == 0);
  }
}

TEST_CASE("an .npz holds named members the reader finds", "[array_writer]") {
  const std::vector<float> features(2 * 3, 0.5f);
  const std::vector<int64_t> mask{1, 1, 0};
  const std::string bytes = npz_bytes({{"caption_feature", "<f4", {1, 3, 2}, features.data(), features.size() * 4},
                                       {"attention_mask", "<i8", {1, 3}, mask.data(), mask.size() * 8}});
  const NpzFile npz = parse_npz(bytes.data(), bytes.size(), "x.npz");
  REQUIRE(npz.find("caption_feature") == 0);
  REQUIRE(npz.find("attention_mask") == 1);
  const NpyArray m = npz.array(1, "attention_mask");
  CHECK(m.kind == 'i');
  CHECK(m.itemsize == 8);
  CHECK(m.shape == std::vector<int64_t>{1, 3});
  CHECK(std::memcmp(m.data, mask.data(), m.bytes) == 0);
  CHECK(npz.array(0, "caption_feature").shape == std::vector<int64_t>{1, 3, 2});
}

TEST_CASE("a shape that does not match the bytes is an error, not a file", "[array_writer]") {
  const float v[3] = {1, 2, 3};
  CHECK_THROWS_WITH(npy_bytes({"", "<f4", {2, 2}, v, sizeof v}), Catch::Contains("12 bytes for shape (2, 2)"));
  CHECK_THROWS_WITH(npy_bytes({"", ">f4", {3}, v, sizeof v}), Catch::Contains("not a little-endian"));
}

TEST_CASE("files are written whole and replace what was there", "[array_writer]") {
  sana::test::TempDir dir;
  const std::string path = dir.path("a.npy");
  write_file_atomically(path, "first");
  write_file_atomically(path, "second, longer");
  std::ifstream in(path, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "second, longer");
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path(""))) entries += e.is_regular_file();
  CHECK(entries == 1);  // no temporary file left
  CHECK_THROWS_WITH(write_file_atomically(dir.path("missing/a.npy"), "x"), Catch::Contains("missing/a.npy"));
}
