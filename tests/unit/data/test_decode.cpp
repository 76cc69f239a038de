// Decoding for training, on files PIL wrote: every mode and depth becomes 8-bit RGB at the
// bucket's size; upstream's resize-to-cover + center-crop; the EXIF orientation ignored as
// PIL does, or applied when asked; reduced decoding (progressive JPEGs at 1/8 from their
// DC scans); and a corpus of bad files that come back as reasons, never as crashes.
// Equality with PIL's pixels is tests/reference/pil_pixels.py's (test reference.pil_pixels).
#include "catch.h"

#include <fstream>
#include <iterator>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "sana/data/decode.h"
#include "sana/data/image_header.h"
#include "sana/data/jpeg_dc.h"
#include "test_support.h"

using namespace sana::data;
using sana::test::TempDir;

namespace {
const TempDir& fixtures() { return sana::test::reference_fixtures("make_image_fixtures.py"); }
DecodeOptions defaults() { return DecodeOptions{}; }
}  // namespace

TEST_CASE("every kind of image becomes 8-bit RGB at the bucket's size", "[decode]") {
  for (const char* name : {"gray.png", "rgba.png", "palette.png", "cmyk.jpg", "sixteen.png",
                           "plain.webp", "plain.bmp", "rotated.jpg", "large.jpg"}) {
    INFO(name);
    const auto d = decode_to_bucket(fixtures().path(name), 48, 64, false, defaults());
    REQUIRE(d.ok());
    CHECK(d.rgb.rows == 48);
    CHECK(d.rgb.cols == 64);
    CHECK(d.rgb.type() == CV_8UC3);
  }
  // Values survive the conversions: 16-bit white is 255, gray 200 stays 200, CMYK cyan
  // is mostly blue-green, the WebP is blue (RGB order).
  CHECK(decode_to_bucket(fixtures().path("sixteen.png"), 8, 8, false, defaults()).rgb.at<cv::Vec3b>(4, 4)[0] == 255);
  CHECK(decode_to_bucket(fixtures().path("gray.png"), 8, 8, false, defaults()).rgb.at<cv::Vec3b>(4, 4)[1] == 200);
  const auto webp = decode_to_bucket(fixtures().path("plain.webp"), 8, 8, false, defaults());
  CHECK(webp.rgb.at<cv::Vec3b>(4, 4)[2] > 200);
  CHECK(webp.rgb.at<cv::Vec3b>(4, 4)[0] < 50);
}

TEST_CASE("the EXIF orientation is ignored as PIL does, or applied when asked", "[decode]") {
  // Stored left red / right blue, orientation 6: displayed with red on top.
  const auto stored = decode_to_bucket(fixtures().path("rotated.jpg"), 80, 120, false, defaults());
  REQUIRE(stored.ok());
  CHECK(stored.rgb.at<cv::Vec3b>(40, 10)[0] > 200);   // red on the left
  CHECK(stored.rgb.at<cv::Vec3b>(40, 110)[2] > 200);  // blue on the right
  DecodeOptions turn;
  turn.exif_orientation = true;
  const auto d = decode_to_bucket(fixtures().path("rotated.jpg"), 120, 80, false, turn);
  REQUIRE(d.ok());
  const auto top = d.rgb.at<cv::Vec3b>(10, 40), bottom = d.rgb.at<cv::Vec3b>(110, 40);
  CHECK(top[0] > 200);     // red
  CHECK(bottom[2] > 200);  // blue
}

TEST_CASE("resize to cover, then center-crop, as upstream", "[decode]") {
  // 200 wide x 100 high -> 50 x 50: scale 0.5 gives 100 x 50, the crop keeps columns 25..74.
  cv::Mat src(100, 200, CV_8UC3);
  for (int x = 0; x < 200; ++x) src.col(x).setTo(cv::Scalar(x, x, x));
  const cv::Mat out = cover_and_crop(src, 50, 50, Resample::box);
  REQUIRE((out.rows == 50 && out.cols == 50));
  CHECK(std::abs(out.at<cv::Vec3b>(25, 0)[0] - 50) <= 1);   // source column ~50
  CHECK(std::abs(out.at<cv::Vec3b>(25, 49)[0] - 148) <= 1);  // source column ~148
  // Flips mirror the crop.
  TempDir dir;
  cv::imwrite(dir.path("ramp.png"), src);
  const auto plain = decode_to_bucket(dir.path("ramp.png"), 50, 50, false, defaults());
  const auto flipped = decode_to_bucket(dir.path("ramp.png"), 50, 50, true, defaults());
  CHECK(plain.rgb.at<cv::Vec3b>(10, 0) == flipped.rgb.at<cv::Vec3b>(10, 49));
  // Flipping while converting gives the values of a flipped decode (the cache relies on it).
  std::vector<float> a(3 * 50 * 50), b(3 * 50 * 50);
  to_chw_normalized(flipped.rgb, a.data());
  to_chw_normalized(plain.rgb, b.data(), true);
  CHECK(a == b);
}

TEST_CASE("large JPEGs decode at reduced size, when asked, with nearly the same result", "[decode]") {
  DecodeOptions reduced;
  reduced.reduced_decode = true;
  const auto fast = decode_to_bucket(fixtures().path("large.jpg"), 192, 256, false, reduced, 1600, 1200);
  const auto full = decode_to_bucket(fixtures().path("large.jpg"), 192, 256, false, defaults(), 1600, 1200);
  REQUIRE((fast.ok() && full.ok()));
  CHECK(fast.reduce == 4);  // 1600/4 = 400 >= 256 and 1200/4 = 300 >= 192; /8 would not cover
  CHECK(full.reduce == 1);
  cv::Mat diff;
  cv::absdiff(fast.rgb, full.rgb, diff);
  CHECK(cv::mean(diff)[0] < 2.0);
}

TEST_CASE("bad files come back with a reason and never crash", "[decode]") {
  const std::vector<std::pair<std::string, BadReason>> corpus = {
      {"no_such_file.jpg", BadReason::missing},     {"bad_empty.jpg", BadReason::empty},
      {"bad_truncated.jpg", BadReason::truncated},  {"bad_truncated.png", BadReason::truncated},
      {"bad_text.jpg", BadReason::not_an_image},    {"bad_html.png", BadReason::not_an_image},
      {"bad_random.webp", BadReason::not_an_image}, {"bad_corrupt.jpg", BadReason::corrupt},
      {"bad_bomb.png", BadReason::too_large},       {"bad_directory.jpg", BadReason::missing},
  };
  for (const auto& [name, reason] : corpus) {
    INFO(name);
    const auto d = decode_to_bucket(fixtures().path(name), 32, 32, false, defaults());
    CHECK(d.bad == reason);
    CHECK(d.rgb.empty());
  }
}

TEST_CASE("a JPEG bomb behind stray bytes is refused before decoding", "[decode]") {
  // libjpeg skips stray bytes before a marker and decodes on; the size check must find the
  // same frame header (here 17968 x 48966 progressive), or the decoder allocates gigabytes.
  // Found by the decode fuzz target (tests/fuzz/regress/decode/).
  TempDir dir;
  std::string jpeg = "\xFF\xD8\xFF\xE0" + std::string("\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00", 16);
  jpeg += "\x37\x3D\x3E\x3B";  // stray bytes
  jpeg += std::string("\xFF\xC2\x00\x11\x08\xBF\x46\x46\x30\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01", 19);
  jpeg += std::string(64, '\x3B') + "\xFF\xD9";
  const auto path = dir.write("bomb.jpg", jpeg);
  const auto size = read_image_size(path);
  REQUIRE(size.ok);
  CHECK(size.width == 17968);
  CHECK(size.height == 48966);
  CHECK(decode_to_bucket(path, 32, 32, false, defaults()).bad == BadReason::too_large);
}

TEST_CASE("a JPEG with data after its end marker decodes, one cut inside its scan does not", "[decode]") {
  // Camera trailers and second images follow the EOI of valid files; an EXIF thumbnail has
  // its own EOI before the main scan, which must not count as the end.
  TempDir dir;
  cv::Mat src(48, 64, CV_8UC3, cv::Scalar(20, 120, 220));
  std::vector<uchar> jpg;
  cv::imencode(".jpg", src, jpg);
  const std::string body(jpg.begin(), jpg.end());
  dir.write("trailer.jpg", body + std::string(300, 'j'));
  const auto ok = decode_to_bucket(dir.path("trailer.jpg"), 32, 32, false, defaults());
  CHECK(ok.ok());
  dir.write("cut.jpg", body.substr(0, body.size() - 40) + std::string(300, 'j'));
  CHECK(decode_to_bucket(dir.path("cut.jpg"), 32, 32, false, defaults()).bad == BadReason::truncated);
}

TEST_CASE("pixels become float CHW in [-1, 1]", "[decode]") {
  cv::Mat rgb(2, 3, CV_8UC3, cv::Scalar(0, 255, 51));
  std::vector<float> out(18);
  to_chw_normalized(rgb, out.data());
  CHECK(out[0] == -1.0f);           // R plane
  CHECK(out[6] == 1.0f);            // G plane
  CHECK(out[12] == Approx(-0.6f));  // B plane: 51/127.5 - 1
}

namespace {
std::vector<uchar> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
// Pixels that differ between two images of the same size and type; -1 when those differ.
int differing(const cv::Mat& a, const cv::Mat& b) {
  if (a.size() != b.size() || a.type() != b.type()) return -1;
  cv::Mat diff;
  cv::absdiff(a, b, diff);
  return cv::countNonZero(diff.reshape(1));
}
}  // namespace

TEST_CASE("a progressive JPEG at 1/8 decodes from its DC scans to the pixels of the whole file", "[decode]") {
  std::vector<std::pair<std::string, std::vector<uchar>>> files;
  for (const char* name : {"progressive420.jpg", "progressive422.jpg", "progressive444.jpg"}) {
    files.emplace_back(name, file_bytes(fixtures().path(name)));
  }
  // OpenCV's encoder, with restart markers inside the scans, on a larger image.
  cv::Mat big(1203, 1601, CV_8UC3);
  cv::randu(big, 0, 255);
  cv::GaussianBlur(big, big, cv::Size(9, 9), 3);
  std::vector<uchar> encoded;
  REQUIRE(cv::imencode(".jpg", big, encoded, {cv::IMWRITE_JPEG_PROGRESSIVE, 1, cv::IMWRITE_JPEG_RST_INTERVAL, 7}));
  files.emplace_back("opencv progressive with restarts", encoded);
  for (const auto& [name, bytes] : files) {
    INFO(name);
    const auto stream = progressive_dc_stream(bytes.data(), bytes.size());
    REQUIRE(!stream.empty());
    CHECK(stream.size() * 2 < bytes.size());  // the luma AC scans are most of the bytes
    const cv::Mat dc = decode_progressive_eighth(bytes.data(), bytes.size());
    const cv::Mat whole = cv::imdecode(bytes, cv::IMREAD_REDUCED_COLOR_8);
    REQUIRE(!dc.empty());
    CHECK(differing(dc, whole) == 0);
  }
}

TEST_CASE("where DC scans alone would not give the same pixels, the whole file is decoded", "[decode]") {
  const auto progressive = file_bytes(fixtures().path("progressive420.jpg"));
  const std::vector<uchar> cut(progressive.begin(), progressive.begin() + static_cast<long>(progressive.size() / 2));
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::vector<uchar>>>{
           {"baseline", file_bytes(fixtures().path("large.jpg"))},
           {"gray", file_bytes(fixtures().path("progressive_gray.jpg"))},
           {"EXIF orientation 6", file_bytes(fixtures().path("progressive_rotated.jpg"))},
           {"cut in a scan", cut},
           {"a PNG", file_bytes(fixtures().path("rgba.png"))},
           {"nothing", {}}}) {
    INFO(name);
    CHECK(decode_progressive_eighth(bytes.data(), bytes.size()).empty());
  }
  // Through the training decoder with the orientation applied: portrait, at 1/8 scale.
  DecodeOptions reduced;
  reduced.reduced_decode = true;
  reduced.exif_orientation = true;
  const auto d = decode_to_bucket(fixtures().path("progressive_rotated.jpg"), 40, 24, false, reduced, 203, 331);
  REQUIRE(d.ok());
  CHECK(d.reduce == 8);
  const auto gray = decode_to_bucket(fixtures().path("progressive_gray.jpg"), 16, 24, false, reduced, 331, 203);
  REQUIRE(gray.ok());
  CHECK(gray.rgb.type() == CV_8UC3);
}
