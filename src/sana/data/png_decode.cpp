#include "sana/data/png_decode.h"

#include <fmt/format.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <opencv2/core.hpp>

#include "sana/data/image_header.h"

namespace sana::data {

namespace {

struct Source {
  const unsigned char* data;
  size_t size;
  size_t at;
};

struct Context {
  Source source;
  char error[256];
  std::vector<std::string>* warnings;
};

// libpng's error handler must not return: it jumps back to the setjmp of the reading
// function below, which returns false.
[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* ctx = static_cast<Context*>(png_get_error_ptr(png));
  std::snprintf(ctx->error, sizeof ctx->error, "%s", message != nullptr ? message : "libpng error");
  png_longjmp(png, 1);
}

void on_warning(png_structp png, png_const_charp message) {
  auto* ctx = static_cast<Context*>(png_get_error_ptr(png));
  try {
    ctx->warnings->emplace_back(message != nullptr ? message : "libpng warning");
  } catch (...) {  // out of memory: the warning is lost, the image is not
  }
}

void on_read(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<Source*>(png_get_io_ptr(png));
  if (n > src->size - src->at) png_error(png, "the file ends early");
  std::memcpy(out, src->data + src->at, n);
  src->at += n;
}

struct Header {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  png_bytep exif = nullptr;  // an eXIf chunk before the pixels (OpenCV reads it there too)
  png_uint_32 exif_size = 0;
};

// The two functions that call setjmp hold no C++ object with a destructor: libpng's
// errors longjmp out of them.
bool read_header(png_structp png, png_infop info, Header& h) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  png_get_IHDR(png, info, &h.width, &h.height, &h.bit_depth, &h.color_type, nullptr, nullptr, nullptr);
  if (png_get_valid(png, info, PNG_INFO_eXIf) != 0) png_get_eXIf_1(png, info, &h.exif_size, &h.exif);
  return true;
}

// OpenCV 4.6's PngDecoder::readData for an 8-bit 3-channel target, transform by transform
// (its png_set_swap for depths below 16 changes nothing and is left out).
bool read_pixels(png_structp png, png_infop info, const Header& h, png_bytep* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  if (h.bit_depth == 16) png_set_strip_16(png);
  png_set_strip_alpha(png);
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if ((h.color_type & PNG_COLOR_MASK_COLOR) == 0 && h.bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if ((h.color_type & PNG_COLOR_MASK_COLOR) != 0) {
    png_set_bgr(png);
  } else {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(h.width) * 3) png_error(png, "unexpected row layout");
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  return true;
}

// cv::imdecode turns the image as its EXIF orientation says (1-8), in this way.
void turn(cv::Mat& img, int orientation) {
  if (orientation >= 5 && orientation <= 8) cv::transpose(img, img);
  switch (orientation) {
    case 2: case 6: cv::flip(img, img, 1); break;
    case 3: case 7: cv::flip(img, img, -1); break;
    case 4: case 8: cv::flip(img, img, 0); break;
    default: break;
  }
}

struct ReadStruct {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~ReadStruct() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
};

struct Tally {
  std::mutex mutex;
  std::map<std::string, int64_t> counts;
};

Tally& tally() {
  static Tally t;
  return t;
}

}  // namespace

bool is_png(const unsigned char* data, size_t size) {
  return size >= 8 && png_sig_cmp(data, 0, 8) == 0;
}

PngDecoded decode_png(const unsigned char* data, size_t size, bool apply_orientation) {
  PngDecoded out;
  Context ctx{{data, size, 0}, {0}, &out.warnings};
  ReadStruct rs;
  rs.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, on_error, on_warning);
  if (rs.png != nullptr) rs.info = png_create_info_struct(rs.png);
  if (rs.png == nullptr || rs.info == nullptr) {
    out.error = "libpng could not allocate its reader";
    return out;
  }
  png_set_read_fn(rs.png, &ctx.source, on_read);
  Header h;
  if (!read_header(rs.png, rs.info, h)) {
    out.error = ctx.error;
    return out;
  }
  try {
    cv::Mat bgr(static_cast<int>(h.height), static_cast<int>(h.width), CV_8UC3);
    std::vector<png_bytep> rows(h.height);
    for (png_uint_32 y = 0; y < h.height; ++y) rows[y] = bgr.ptr<uchar>(static_cast<int>(y));
    if (read_pixels(rs.png, rs.info, h, rows.data())) {
      if (apply_orientation && h.exif != nullptr) turn(bgr, tiff_orientation(h.exif, h.exif_size));
      out.bgr = bgr;
    } else {
      out.error = ctx.error;
    }
  } catch (const std::exception& e) {  // the pixel buffer could not be allocated
    out.error = fmt::format("{}x{} pixels: {}", h.width, h.height, e.what());
  }
  return out;
}

bool record_codec_warning(const std::string& reason) {
  std::lock_guard<std::mutex> lock(tally().mutex);
  return ++tally().counts[reason] == 1;
}

std::map<std::string, int64_t> codec_warning_counts() {
  std::lock_guard<std::mutex> lock(tally().mutex);
  return tally().counts;
}

std::string codec_warning_summary() {
  std::string out;
  for (const auto& [reason, n] : codec_warning_counts()) {
    out += fmt::format("{}{} x '{}'", out.empty() ? "" : "; ", n, reason);
  }
  return out;
}

}  // namespace sana::data
