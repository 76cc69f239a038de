// PNGs through libpng with our handlers: bitwise the pixels of cv::imdecode (IMREAD_COLOR)
// for every bit depth, colour type, palette, transparency, interlacing and EXIF
// orientation, and on the example photos; libpng's warnings come back as values and
// nothing reaches stderr (cv::imdecode prints them for the same photos).
#include "catch.h"

#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <opencv2/imgcodecs.hpp>
#include <random>

#include "sana/data/png_decode.h"
#include "test_support.h"

using namespace sana::data;

namespace {

struct PngSpec {
  int bit_depth = 8;
  int color_type = PNG_COLOR_TYPE_RGB;
  bool interlaced = false;
  bool transparency = false;  // a tRNS chunk (palette alpha, or a transparent gray/RGB value)
  int orientation = 0;        // an eXIf chunk with this orientation; 0: none
  bool text = false;          // a tEXt chunk
};

void append(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::vector<unsigned char>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
void no_flush(png_structp) {}

int channels_of(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY: case PNG_COLOR_TYPE_PALETTE: return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    default: return 4;
  }
}

// A 13 x 7 image of random samples in the spec's format.
std::vector<unsigned char> write_png(const PngSpec& s) {
  const int w = 13, h = 7;
  std::vector<unsigned char> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, append, no_flush);
  png_set_IHDR(png, info, w, h, s.bit_depth, s.color_type, s.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  std::mt19937 rng(static_cast<unsigned>(s.bit_depth * 100 + s.color_type * 10 + s.orientation));
  const int entries = 1 << std::min(s.bit_depth, 8);
  std::vector<png_color> palette(static_cast<size_t>(entries));
  for (auto& c : palette) c = {static_cast<png_byte>(rng()), static_cast<png_byte>(rng()), static_cast<png_byte>(rng())};
  if (s.color_type == PNG_COLOR_TYPE_PALETTE) png_set_PLTE(png, info, palette.data(), entries);
  std::vector<png_byte> alpha(static_cast<size_t>(entries));
  for (auto& a : alpha) a = static_cast<png_byte>(rng());
  png_color_16 transparent{};
  transparent.gray = transparent.red = transparent.green = transparent.blue = 1;
  if (s.transparency) png_set_tRNS(png, info, alpha.data(), entries, &transparent);
  // A big-endian TIFF with one IFD entry: orientation (0x0112), SHORT, count 1.
  std::vector<png_byte> exif = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1,
                                0, static_cast<png_byte>(s.orientation), 0, 0, 0, 0, 0, 0};
  if (s.orientation > 0) png_set_eXIf_1(png, info, static_cast<png_uint_32>(exif.size()), exif.data());
  char key[] = "Comment", caption[] = "a caption";
  png_text text{};
  text.compression = PNG_TEXT_COMPRESSION_NONE;
  text.key = key;
  text.text = caption;
  if (s.text) png_set_text(png, info, &text, 1);
  const size_t row_bytes = (static_cast<size_t>(w) * channels_of(s.color_type) * s.bit_depth + 7) / 8;
  std::vector<std::vector<png_byte>> rows(h, std::vector<png_byte>(row_bytes));
  std::vector<png_bytep> pointers;
  for (auto& r : rows) {
    for (auto& b : r) b = static_cast<png_byte>(rng());
    if (s.color_type == PNG_COLOR_TYPE_PALETTE && s.bit_depth == 8) {
      for (auto& b : r) b = static_cast<png_byte>(b % entries);
    }
    pointers.push_back(r.data());
  }
  png_set_rows(png, info, pointers.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

bool same_pixels(const cv::Mat& a, const cv::Mat& b) {
  return a.size() == b.size() && a.type() == b.type() && cv::norm(a, b, cv::NORM_INF) == 0;
}

// What the process writes to stderr (fd 2) while `f` runs.
template <class F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  std::FILE* capture = std::tmpfile();
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(capture), STDERR_FILENO);
  f();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::rewind(capture);
  std::string text;
  for (int c = std::fgetc(capture); c != EOF; c = std::fgetc(capture)) text += static_cast<char>(c);
  std::fclose(capture);
  return text;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("PNGs of every format decode to cv::imdecode's pixels", "[decode][png]") {
  std::vector<PngSpec> specs;
  for (int depth : {1, 2, 4, 8, 16}) specs.push_back({depth, PNG_COLOR_TYPE_GRAY});
  for (int depth : {1, 2, 4, 8}) {
    specs.push_back({depth, PNG_COLOR_TYPE_PALETTE});
    specs.push_back({depth, PNG_COLOR_TYPE_PALETTE, false, true});
  }
  for (int depth : {8, 16}) {
    specs.push_back({depth, PNG_COLOR_TYPE_GRAY_ALPHA});
    specs.push_back({depth, PNG_COLOR_TYPE_RGB});
    specs.push_back({depth, PNG_COLOR_TYPE_RGB, false, true});
    specs.push_back({depth, PNG_COLOR_TYPE_RGB_ALPHA});
    specs.push_back({depth, PNG_COLOR_TYPE_GRAY, false, true});
  }
  specs.push_back({8, PNG_COLOR_TYPE_RGB, true});
  specs.push_back({2, PNG_COLOR_TYPE_GRAY, true});
  specs.push_back({16, PNG_COLOR_TYPE_RGB_ALPHA, true});
  for (int o = 1; o <= 8; ++o) specs.push_back({8, PNG_COLOR_TYPE_RGB, false, false, o});
  for (const auto& s : specs) {
    INFO("bit depth " << s.bit_depth << ", colour type " << s.color_type << ", interlaced " << s.interlaced
                      << ", tRNS " << s.transparency << ", orientation " << s.orientation);
    const auto bytes = write_png(s);
    REQUIRE(is_png(bytes.data(), bytes.size()));
    const PngDecoded ours = decode_png(bytes.data(), bytes.size());
    REQUIRE(ours.error.empty());
    const cv::Mat theirs = cv::imdecode(bytes, cv::IMREAD_COLOR);
    CHECK(same_pixels(ours.bgr, theirs));
    if (s.orientation >= 5) CHECK(ours.bgr.rows == 13);  // turned: 7 x 13 stored
  }
}

TEST_CASE("a broken PNG is an error, as for cv::imdecode, and prints nothing", "[decode][png]") {
  auto bytes = write_png({8, PNG_COLOR_TYPE_RGB});
  auto truncated = bytes;
  truncated.resize(bytes.size() / 2);
  auto bad_crc = bytes;
  bad_crc[bad_crc.size() - 20] ^= 0x55;  // inside the IDAT chunk's data or CRC
  for (const auto* b : {&truncated, &bad_crc}) {
    PngDecoded ours;
    const std::string printed = stderr_of([&] { ours = decode_png(b->data(), b->size()); });
    CHECK_FALSE(ours.error.empty());
    CHECK(ours.bgr.empty());
    CHECK(printed.empty());
    cv::Mat theirs;
    CHECK_FALSE(stderr_of([&] { theirs = cv::imdecode(*b, cv::IMREAD_COLOR); }).empty());  // OpenCV's libpng says why
    CHECK(theirs.empty());
  }
}

TEST_CASE("the example photos' PNGs: the same pixels, warnings as values, silence on stderr", "[decode][png]") {
  const char* env = std::getenv("SANA_EXAMPLE_DATA");
  const std::string root = env != nullptr ? env : "/usr/share/backgrounds/mate";
  std::vector<std::string> pngs;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.path().extension() == ".png") pngs.push_back(e.path().string());
  }
  REQUIRE(pngs.size() >= 5);
  for (const auto& path : pngs) {
    INFO(path);
    const auto bytes = read_bytes(path);
    PngDecoded ours;
    const std::string printed = stderr_of([&] { ours = decode_png(bytes.data(), bytes.size()); });
    CHECK(printed.empty());
    REQUIRE(ours.error.empty());
    cv::Mat theirs;
    const std::string opencv_printed = stderr_of([&] { theirs = cv::imdecode(bytes, cv::IMREAD_COLOR); });
    CHECK(same_pixels(ours.bgr, theirs));
    // What OpenCV's libpng printed for this photo (Debian 12's libpng warns about some of the
    // mate photos' sRGB profiles, trixie's does not) we hold as values, and nothing more.
    CHECK(ours.warnings.empty() == (opencv_printed.find("libpng warning") == std::string::npos));
  }
}

TEST_CASE("a damaged ancillary chunk is a warning as a value, the pixels are cv::imdecode's", "[decode][png]") {
  // A tEXt chunk whose CRC is wrong: libpng (every 1.6) warns, drops the chunk and decodes on.
  PngSpec spec;
  spec.text = true;
  auto bytes = write_png(spec);
  const std::string tag = "tEXt";
  const auto at = std::search(bytes.begin(), bytes.end(), tag.begin(), tag.end());
  REQUIRE(at != bytes.end());
  const size_t type_at = static_cast<size_t>(at - bytes.begin());
  const size_t length = (size_t{bytes[type_at - 4]} << 24) | (size_t{bytes[type_at - 3]} << 16) |
                        (size_t{bytes[type_at - 2]} << 8) | size_t{bytes[type_at - 1]};
  bytes[type_at + 4 + length] ^= 0xff;  // the chunk's CRC
  PngDecoded ours;
  const std::string printed = stderr_of([&] { ours = decode_png(bytes.data(), bytes.size()); });
  CHECK(printed.empty());
  REQUIRE(ours.error.empty());
  REQUIRE(ours.warnings.size() == 1);
  CHECK(ours.warnings.front().find("CRC") != std::string::npos);
  cv::Mat theirs;
  const std::string opencv_printed = stderr_of([&] { theirs = cv::imdecode(bytes, cv::IMREAD_COLOR); });
  CHECK(opencv_printed.find("libpng warning") != std::string::npos);
  CHECK(same_pixels(ours.bgr, theirs));
}

TEST_CASE("codec warnings are counted per reason and said once", "[decode][png]") {
  const auto before = codec_warning_counts();
  const std::string reason = "test: a reason no codec gives";
  CHECK(record_codec_warning(reason));
  CHECK_FALSE(record_codec_warning(reason));
  CHECK(codec_warning_counts().at(reason) == 2);
  CHECK(codec_warning_summary().find("2 x '" + reason + "'") != std::string::npos);
  CHECK(before.count(reason) == 0);
}
