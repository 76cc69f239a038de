// The dataset index as a user meets it: every source kind, sizes read from image
// headers (EXIF orientation included), identical bytes for identical input, and clear
// errors for truncated, foreign or malformed files.
#include "catch.h"

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <sstream>

#include "sana/data/dataset_index.h"
#include "sana/data/image_header.h"
#include "sana/data/index_builder.h"
#include "test_support.h"

using namespace sana::data;
using sana::test::TempDir;

namespace {

// `threads` header readers, no progress lines.
IndexBuildOptions quiet(int threads) {
  IndexBuildOptions o;
  o.threads = threads;
  o.progress_every_s = 0;
  return o;
}

std::string write_image(const TempDir& dir, const std::string& name, int h, int w) {
  const std::string path = dir.path(name);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  cv::Mat img(h, w, CV_8UC3, cv::Scalar(10, 200, 30));
  REQUIRE(cv::imwrite(path, img));
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A JPEG of h x w whose EXIF says "rotate 90" (orientation 6): it displays as w x h.
std::string write_rotated_jpeg(const TempDir& dir, int h, int w) {
  std::vector<uchar> jpg;
  cv::imencode(".jpg", cv::Mat(h, w, CV_8UC3, cv::Scalar(1, 2, 3)), jpg);
  // APP1: "Exif\0\0", TIFF little-endian header, IFD with one entry: 0x0112 = 6.
  const std::vector<uchar> tiff = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0,
                                   0,   0,   6,  0, 0, 0, 0, 0, 0, 0};
  std::vector<uchar> app1 = {0xFF, 0xE1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
  app1.insert(app1.end(), tiff.begin(), tiff.end());
  const size_t len = app1.size() - 2;
  app1[2] = static_cast<uchar>(len >> 8);
  app1[3] = static_cast<uchar>(len & 0xFF);
  jpg.insert(jpg.begin() + 2, app1.begin(), app1.end());
  const std::string path = dir.path("rotated.jpg");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(jpg.data()),
                                              static_cast<std::streamsize>(jpg.size()));
  return path;
}

}  // namespace

TEST_CASE("image sizes come from headers of every common format", "[index]") {
  TempDir dir;
  for (const char* ext : {"png", "jpg", "bmp", "webp"}) {
    INFO(ext);
    const auto s = read_image_size(write_image(dir, std::string("a.") + ext, 37, 91));
    CHECK(s.ok);
    CHECK(s.width == 91);
    CHECK(s.height == 37);
  }
  // Stored 80 wide: that is its size as PIL (and so upstream) decodes it; with the
  // orientation applied it is 30 wide, as OpenCV's default decode agrees.
  const auto rotated = read_image_size(write_rotated_jpeg(dir, 30, 80));
  CHECK((rotated.ok && rotated.width == 80 && rotated.height == 30 && rotated.orientation == 6));
  const auto turned = rotated.as_decoded(true);
  CHECK((turned.width == 30 && turned.height == 80));
  CHECK(cv::imread(dir.path("rotated.jpg")).cols == 30);
  CHECK(read_image_size(dir.path("missing.png")).error == "missing");
  dir.write("empty.jpg", "");
  CHECK(read_image_size(dir.path("empty.jpg")).error == "empty");
  dir.write("text.png", "this is not an image at all");
  CHECK(read_image_size(dir.path("text.png")).error == "not an image");
  dir.write("cut.jpg", slurp(write_image(dir, "full.jpg", 10, 10)).substr(0, 20));
  CHECK(read_image_size(dir.path("cut.jpg")).error == "truncated");
}

TEST_CASE("an image folder becomes an index with captions from sidecar files", "[index]") {
  TempDir dir;
  write_image(dir, "imgs/b/wide.png", 20, 80);
  write_image(dir, "imgs/a/tall.jpg", 90, 30);
  write_image(dir, "imgs/a/plain.bmp", 16, 16);
  dir.write("imgs/b/wide.txt", "  a wide picture \n");
  dir.write("imgs/a/tall.json", R"({"caption": "a tall one", "label": 3})");
  dir.write("imgs/notes.md", "not an image");
  const auto r = build_index({dir.path("imgs")}, dir.path("out.sidx"));
  CHECK(r.rows == 3);
  CHECK(r.sizes_read == 3);
  const auto idx = DatasetIndex::open(dir.path("out.sidx"));
  REQUIRE(idx.size() == 3);
  // Sorted by path, whatever order the file system lists them in.
  CHECK(idx.text(0).path.find("a/plain.bmp") != std::string_view::npos);
  CHECK(idx.text(1).caption == "a tall one");
  CHECK(idx.record(1).label == 3);
  CHECK((idx.record(1).width == 30 && idx.record(1).height == 90));
  CHECK(idx.text(2).caption == "a wide picture");
  CHECK(idx.record(2).label == -1);
  CHECK(idx.fingerprint() == r.fingerprint);
}

TEST_CASE("JSONL and CSV metadata: relative paths, given or missing sizes, labels, features",
          "[index]") {
  TempDir dir;
  write_image(dir, "data/img/x.png", 40, 60);
  dir.write("data/meta.jsonl",
            "{\"path\": \"img/x.png\", \"caption\": \"read my size\"}\n"
            "\n"
            "{\"image\": \"/abs/y.jpg\", \"prompt\": \"given\", \"width\": 640, \"height\": 480, "
            "\"label\": 7, \"latent\": \"lat/y.npy\"}\n");
  dir.write("data/meta.csv",
            "file_name,caption,width,height\n"
            "img/x.png,\"a caption, with a comma and \"\"quotes\"\"\",,\n"
            "gone.png,missing file,,\n");
  const auto r = build_index({dir.path("data/meta.jsonl"), dir.path("data/meta.csv")},
                             dir.path("m.sidx"), quiet(1));
  CHECK(r.rows == 4);
  CHECK(r.sizes_read == 2);
  CHECK(r.unreadable == 1);
  const auto idx = DatasetIndex::open(dir.path("m.sidx"));
  CHECK(idx.text(0).path == dir.path("data/img/x.png"));
  CHECK((idx.record(0).width == 60 && idx.record(0).height == 40));
  CHECK(idx.text(1).path == "/abs/y.jpg");
  CHECK((idx.record(1).width == 640 && idx.record(1).label == 7));
  CHECK(idx.text(1).latent == dir.path("data/lat/y.npy"));
  CHECK((idx.record(1).flags & kHasLatent) != 0);
  CHECK(idx.text(2).caption == "a caption, with a comma and \"quotes\"");
  CHECK((idx.record(3).flags & kSizeUnknown) != 0);  // kept, flagged for substitution
}

TEST_CASE("a quoted CSV field may span lines, errors after it name the editor's line", "[index]") {
  TempDir dir;
  write_image(dir, "a.png", 8, 8);
  write_image(dir, "b.png", 8, 8);
  dir.write("multi.csv", "path,caption\na.png,\"line one\nline two, with \"\"quotes\"\"\"\nb.png,plain\n");
  build_index({dir.path("multi.csv")}, dir.path("m.sidx"));
  const auto idx = DatasetIndex::open(dir.path("m.sidx"));
  REQUIRE(idx.size() == 2);
  CHECK(idx.text(0).caption == "line one\nline two, with \"quotes\"");
  CHECK(idx.text(1).caption == "plain");
  dir.write("late.csv", "path,caption,width\na.png,\"two\nlines\",3\nb.png,x,wide\n");
  CHECK_THROWS_WITH(build_index({dir.path("late.csv")}, dir.path("x.sidx")), Catch::Contains("late.csv:4: width"));
}

TEST_CASE("the same input gives the same bytes", "[index]") {
  TempDir dir;
  for (int i = 0; i < 20; ++i) write_image(dir, "f/" + std::to_string(i) + ".png", 8 + i, 30 - i);
  build_index({dir.path("f")}, dir.path("one.sidx"), quiet(1));
  build_index({dir.path("f")}, dir.path("two.sidx"), quiet(2));
  CHECK(slurp(dir.path("one.sidx")) == slurp(dir.path("two.sidx")));
  // An index is also a source: re-indexing it reproduces it.
  build_index({dir.path("one.sidx")}, dir.path("three.sidx"));
  CHECK(slurp(dir.path("one.sidx")) == slurp(dir.path("three.sidx")));
}

TEST_CASE("truncated, foreign and malformed inputs are clear errors", "[index]") {
  TempDir dir;
  write_image(dir, "f/a.png", 8, 8);
  build_index({dir.path("f")}, dir.path("ok.sidx"));
  const std::string bytes = slurp(dir.path("ok.sidx"));
  dir.write("cut.sidx", bytes.substr(0, bytes.size() - 3));
  CHECK_THROWS_WITH(DatasetIndex::open(dir.path("cut.sidx")), Catch::Contains("truncated or damaged"));
  dir.write("tiny.sidx", "SANA");
  CHECK_THROWS_WITH(DatasetIndex::open(dir.path("tiny.sidx")), Catch::Contains("shorter than its header"));
  dir.write("foreign.sidx", std::string(200, 'x'));
  CHECK_THROWS_WITH(DatasetIndex::open(dir.path("foreign.sidx")), Catch::Contains("wrong magic"));
  CHECK_THROWS_WITH(DatasetIndex::open(dir.path("none.sidx")), Catch::Contains("cannot open"));
  dir.write("bad.jsonl", "{\"path\": \"a.png\"}\n{not json\n");
  CHECK_THROWS_WITH(build_index({dir.path("bad.jsonl")}, dir.path("x.sidx")),
                    Catch::Contains("bad.jsonl:2: not a JSON object"));
  dir.write("nopath.jsonl", "{\"caption\": \"no image\"}\n");
  CHECK_THROWS_WITH(build_index({dir.path("nopath.jsonl")}, dir.path("x.sidx")),
                    Catch::Contains("nopath.jsonl:1: no image path"));
  dir.write("nopath.csv", "caption,width\nx,3\n");
  CHECK_THROWS_WITH(build_index({dir.path("nopath.csv")}, dir.path("x.sidx")),
                    Catch::Contains("names no image path column"));
  dir.write("size.csv", "path,width,height\na.png,wide,3\n");
  CHECK_THROWS_WITH(build_index({dir.path("size.csv")}, dir.path("x.sidx")),
                    Catch::Contains("size.csv:2: width 'wide' is not a size"));
  CHECK_THROWS_WITH(build_index({dir.path("nothing")}, dir.path("x.sidx")),
                    Catch::Contains("does not exist"));
  // Found by the bad-input catalogue (tests/apps/bad_inputs.sh): a width with a unit, a
  // CSV that is not UTF-8, a path over the index's 64 KiB limit, a quote never closed.
  dir.write("px.jsonl", "{\"path\": \"a.png\", \"width\": \"64px\", \"height\": 48}\n");
  CHECK_THROWS_WITH(build_index({dir.path("px.jsonl")}, dir.path("x.sidx")),
                    Catch::Contains("px.jsonl:1: width '64px' is not a size"));
  dir.write("latin1.csv", "path,caption\na.png,caf\xe9\n");
  CHECK_THROWS_WITH(build_index({dir.path("latin1.csv")}, dir.path("x.sidx")),
                    Catch::Contains("latin1.csv:2: byte 10 (0xE9) is not UTF-8"));
  dir.write("long.jsonl", "{\"path\": \"a.png\"}\n{\"path\": \"" + std::string(70000, 'p') + "\"}\n");
  CHECK_THROWS_WITH(build_index({dir.path("long.jsonl")}, dir.path("x.sidx")),
                    Catch::Contains("long.jsonl:2: the image path is 700") && Catch::Contains("(at most 65535)"));
  dir.write("open.csv", "path,caption\na.png,\"never closed\nb.png,x\n");
  CHECK_THROWS_WITH(build_index({dir.path("open.csv")}, dir.path("x.sidx")),
                    Catch::Contains("open.csv:2: a quoted field is never closed"));
  CHECK_FALSE(std::filesystem::exists(dir.path("x.sidx")));  // no half-written index left
}

TEST_CASE("sources are indexed once and cached by path, size and time", "[index]") {
  TempDir dir;
  write_image(dir, "f/a.png", 8, 8);
  const std::string first = ensure_index({dir.path("f")}, dir.path("cache"));
  CHECK(ensure_index({dir.path("f")}, dir.path("cache")) == first);
  CHECK(ensure_index({first}, dir.path("elsewhere")) == first);  // an index is used as is
}
