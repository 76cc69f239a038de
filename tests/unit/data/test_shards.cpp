// Upstream Sana's on-disk layouts, on files Python wrote (tests/reference/
// make_feature_fixtures.py): tar shards listed in wids-meta.json (Python's tarfile in pax
// and GNU formats, long member names), members read by reference, .npz archives stored
// and deflated, and clear errors for damaged, truncated or compressed files.
#include "catch.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "sana/data/array_file.h"
#include "sana/data/dataset_index.h"
#include "sana/data/decode.h"
#include "sana/data/file_ref.h"
#include "sana/data/image_header.h"
#include "sana/data/index_builder.h"
#include "sana/data/tar_reader.h"
#include "test_support.h"

using namespace sana::data;
using sana::test::TempDir;

namespace {
const TempDir& fixtures() { return sana::test::reference_fixtures("make_feature_fixtures.py"); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string read_member(const std::string& ref) {
  std::vector<char> bytes;
  const std::string why = read_ref(ref, bytes);
  INFO(ref);
  REQUIRE(why.empty());
  return std::string(bytes.begin(), bytes.end());
}

IndexBuildOptions quiet() {
  IndexBuildOptions o;
  o.threads = 1;
  o.progress_every_s = 0;
  return o;
}
}  // namespace

TEST_CASE("tar shards list their members, long names included, readable by reference", "[shards]") {
  for (const char* shard : {"shard-000.tar", "shard-001.tar"}) {  // pax, GNU
    INFO(shard);
    const std::string path = fixtures().path(std::string("wids/") + shard);
    std::vector<TarMember> members;
    scan_tar(path, [&](const TarMember& m) { members.push_back(m); });
    REQUIRE(members.size() >= 10);
    bool long_name = false;
    for (const auto& m : members) {
      long_name = long_name || m.name.size() > 100;
      const std::string ref = member_ref(path, m.name, m.offset, m.size);
      const FileRef parsed = parse_file_ref(ref);
      CHECK(parsed.file == path);
      CHECK(parsed.member == m.name);
      CHECK(format_name(ref) == m.name);
      if (m.name.size() > 5 && m.name.compare(m.name.size() - 5, 5, ".json") == 0) {
        CHECK(read_member(ref).find("\"prompt\": \"sample ") != std::string::npos);
      }
    }
    CHECK(long_name == (std::string(shard) == "shard-000.tar"));
  }
  CHECK(parse_file_ref("/data/a#b@1+2.png").file == "/data/a#b@1+2.png");  // not a member form
  CHECK_FALSE(parse_file_ref("/data/x.tar#@1+2").in_tar());

  TempDir dir;
  const std::string whole = slurp(fixtures().path("wids/shard-001.tar"));
  std::ofstream(dir.path("cut.tar"), std::ios::binary) << whole.substr(0, whole.size() / 2 + 100);
  CHECK_THROWS_WITH(scan_tar(dir.path("cut.tar"), [](const TarMember&) {}), Catch::Contains("truncated shard"));
  std::ofstream(dir.path("gz.tar"), std::ios::binary) << std::string("\x1f\x8b\x08\x00", 4) << std::string(600, 'x');
  CHECK_THROWS_WITH(scan_tar(dir.path("gz.tar"), [](const TarMember&) {}), Catch::Contains("compressed"));
  std::string damaged = whole;
  damaged[130] ^= 0x01;  // the first header's size field
  std::ofstream(dir.path("bad.tar"), std::ios::binary) << damaged;
  CHECK_THROWS_WITH(scan_tar(dir.path("bad.tar"), [](const TarMember&) {}), Catch::Contains("damaged tar header"));
  const auto ref = member_ref(dir.path("cut.tar"), "x.npy", whole.size() / 2, 4096);
  std::vector<char> bytes;
  CHECK_THAT(read_ref(ref, bytes), Catch::Contains("truncated shard"));
}

TEST_CASE("npz archives as NumPy writes them, stored and deflated", "[shards]") {
  for (const char* name : {"txt_stored.npz", "txt_compressed.npz"}) {
    INFO(name);
    const std::string bytes = slurp(fixtures().path(name));
    const NpzFile f = parse_npz(bytes.data(), bytes.size(), name);
    REQUIRE(f.names == std::vector<std::string>{"caption_feature", "attention_mask"});
    const NpyArray feat = f.array(0, name), mask = f.array(1, name);
    CHECK(feat.kind == 'f');
    CHECK(feat.itemsize == 2);
    CHECK(feat.shape == std::vector<int64_t>{1, 3, 6});
    CHECK(mask.kind == 'i');
    CHECK(mask.shape == std::vector<int64_t>{1, 3});
    const auto* m = reinterpret_cast<const int16_t*>(mask.data);
    CHECK((m[0] == 1 && m[1] == 1 && m[2] == 0));
  }
  const std::string damaged = slurp(fixtures().path("damaged.npz"));
  CHECK_THROWS_AS(parse_npz(damaged.data(), damaged.size(), "damaged.npz"), ArrayFileError);
  const std::string cut = slurp(fixtures().path("cut.npz"));
  CHECK_THROWS_WITH(parse_npz(cut.data(), cut.size(), "cut.npz"), Catch::Contains("truncated"));
  const std::string npy = slurp(fixtures().path("half.npy"));
  CHECK_THROWS_WITH(parse_npz(npy.data(), npy.size(), "half.npy"), Catch::Contains("not a zip archive"));
}

TEST_CASE("a wids dataset indexes as upstream's SanaWebDatasetMS reads it", "[shards][index]") {
  TempDir out;
  const auto r = build_index({fixtures().path("wids")}, out.path("index.sidx"), quiet());
  REQUIRE(r.rows == 8);  // 2 shards x 4 samples; the stray member without .json left out
  const auto idx = DatasetIndex::open(out.path("index.sidx"));
  std::map<std::string, int> text_in_shard;
  for (uint64_t i = 0; i < idx.size(); ++i) {
    const auto t = idx.text(i);
    INFO(t.path);
    CHECK(t.caption == "sample " + std::to_string(i));  // shard order, then member order
    CHECK(idx.record(i).width == 40);
    CHECK(idx.record(i).height == 24);
    CHECK(parse_file_ref(std::string(t.path)).member.find(".json") != std::string::npos);  // no image member
    CHECK(format_name(std::string(t.latent)).find(".npy") != std::string::npos);
    const bool in_shard = parse_file_ref(std::string(t.text_feat)).in_tar();
    CHECK(in_shard == (i % 2 == 1));  // odd samples carry it, even ones lie beside wids-meta.json
    CHECK(read_member(std::string(t.latent)).substr(1, 5) == "NUMPY");
  }
  // One shard alone, and wids-meta.json named directly, index the same samples.
  CHECK(build_index({fixtures().path("wids/shard-001.tar")}, out.path("one.sidx"), quiet()).rows == 4);
  CHECK(build_index({fixtures().path("wids/wids-meta.json")}, out.path("meta.sidx"), quiet()).rows == 8);
}

TEST_CASE("images inside a shard decode like the same file outside it", "[shards][decode]") {
  TempDir out;
  REQUIRE(build_index({fixtures().path("images.tar")}, out.path("i.sidx"), quiet()).rows == 2);
  const auto idx = DatasetIndex::open(out.path("i.sidx"));
  CHECK(idx.record(1).width == 40);  // b.json has no size: read from the PNG member's header
  CHECK(idx.record(1).height == 24);
  const DecodeOptions o;
  const auto plain = decode_to_bucket(fixtures().path("plain.png"), 16, 24, false, o);
  REQUIRE(plain.ok());
  for (uint64_t i = 0; i < 2; ++i) {
    const auto member = decode_to_bucket(std::string(idx.text(i).path), 16, 24, false, o);
    REQUIRE(member.ok());
    CHECK(cv::norm(member.rgb, plain.rgb, cv::NORM_INF) == 0);
  }
}
