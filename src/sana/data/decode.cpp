#include "sana/data/decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/data/file_ref.h"
#include "sana/data/image_header.h"
#include "sana/data/jpeg_dc.h"
#include "sana/data/png_decode.h"
#include "sana/util/log.h"

namespace sana::data {

const char* reason_name(BadReason r) {
  switch (r) {
    case BadReason::none: return "ok";
    case BadReason::missing: return "missing";
    case BadReason::empty: return "empty";
    case BadReason::truncated: return "truncated";
    case BadReason::corrupt: return "corrupt";
    case BadReason::not_an_image: return "not an image";
    case BadReason::too_large: return "too large";
    case BadReason::unsupported: return "unsupported format";
  }
  return "unknown";
}

std::string DecodeOptions::describe() const {
  return fmt::format("filter {}, jpeg {}, exif {}", filter ? resample_name(*filter) : "per table",
                     reduced_decode ? "reduced" : "full", exif_orientation ? "applied" : "ignored");
}

Resample filter_for_table(const std::string& table_name) {
  // SanaWebDatasetMS picks LANCZOS for these two tables and BICUBIC otherwise; the
  // single-scale dataset's default_train transform is T.Resize's default, BILINEAR.
  if (table_name == "ASPECT_RATIO_2048" || table_name == "ASPECT_RATIO_2880") return Resample::lanczos;
  if (table_name.rfind("square_", 0) == 0) return Resample::bilinear;
  return Resample::bicubic;
}

namespace {

DecodedImage bad(BadReason r, std::string detail) {
  DecodedImage d;
  d.bad = r;
  d.detail = std::move(detail);
  return d;
}

// Where a JPEG's entropy-coded data starts: after the first SOS segment, found by walking
// the marker segments (an EXIF thumbnail inside APP1 has its own EOI, skipped this way).
// npos when the segments do not parse.
size_t jpeg_scan_start(const std::vector<uchar>& b) {
  size_t i = 2;
  while (i + 4 <= b.size()) {
    if (b[i] != 0xFF) return std::string::npos;
    const uchar m = b[i + 1];
    if (m == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    const size_t len = (static_cast<size_t>(b[i + 2]) << 8) | b[i + 3];
    if (m == 0xDA) return i + 2 + len;
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) {
      i += 2;
      continue;
    }
    if (len < 2) return std::string::npos;
    i += 2 + len;
  }
  return std::string::npos;
}

// A JPEG must have its EOI marker after the scan, and a PNG must end with its IEND chunk;
// decoders fill a cut file with gray and say nothing, so the check is ours. Data after a
// JPEG's EOI (camera trailers, a second image) is allowed: it decodes fine.
bool looks_complete(const std::vector<uchar>& b) {
  size_t end = b.size();
  while (end > 0 && b[end - 1] == 0) --end;  // some writers pad with zeros
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8) {
    if (end >= 2 && b[end - 2] == 0xFF && b[end - 1] == 0xD9) return true;
    const size_t scan = jpeg_scan_start(b);
    if (scan == std::string::npos || scan >= b.size()) return false;
    // In entropy-coded data 0xFF is followed by 0x00 or a restart marker: FF D9 is the EOI.
    static const uchar eoi[] = {0xFF, 0xD9};
    return std::search(b.begin() + static_cast<std::ptrdiff_t>(scan), b.end(), eoi, eoi + 2) != b.end();
  }
  if (b.size() >= 8 && b[0] == 0x89 && b[1] == 'P') {
    static const uchar iend[] = {'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
    return end >= 8 && std::equal(iend, iend + 8, b.begin() + static_cast<std::ptrdiff_t>(end - 8));
  }
  return true;
}

}  // namespace

cv::Mat cover_and_crop(const cv::Mat& image, int th, int tw, Resample filter) {
  // Upstream's sizes: int(w * th / h) with the product exact and one rounding, as Python's
  // true division of integers gives it.
  const int h = image.rows, w = image.cols;
  int rh = th, rw = tw;
  if (static_cast<double>(th) / h > static_cast<double>(tw) / w) {
    rw = std::max(tw, static_cast<int>(static_cast<double>(w) * th / h));
  } else {
    rh = std::max(th, static_cast<int>(static_cast<double>(h) * tw / w));
  }
  // torchvision's CenterCrop rounds with Python's round(): halves go to the even number.
  const int top = static_cast<int>(std::nearbyint((rh - th) / 2.0));
  const int left = static_cast<int>(std::nearbyint((rw - tw) / 2.0));
  return resize_and_crop(image, rh, rw, cv::Rect(left, top, tw, th), filter);
}

DecodedImage decode_to_bucket(const std::string& path, int th, int tw, bool flip,
                              const DecodeOptions& opts, int source_w, int source_h) {
  std::vector<uchar> bytes;
  const std::string unreadable = read_ref(path, bytes);  // a file or a tar shard's member
  if (!unreadable.empty()) return bad(BadReason::missing, unreadable);
  if (bytes.empty()) return bad(BadReason::empty, "zero bytes");
  if (source_w <= 0 || source_h <= 0) {
    const ImageSize s = read_image_size(bytes.data(), bytes.size()).as_decoded(opts.exif_orientation);
    if (s.ok) {
      source_w = s.width;
      source_h = s.height;
    }
  }
  if (static_cast<double>(source_w) * source_h > opts.max_pixels) {
    return bad(BadReason::too_large, fmt::format("{}x{} pixels", source_w, source_h));
  }
  if (!looks_complete(bytes)) return bad(BadReason::truncated, "the file ends early");

  // Any depth, gray, alpha or palette -> 8-bit BGR.
  const int orientation = opts.exif_orientation ? 0 : cv::IMREAD_IGNORE_ORIENTATION;
  int flags = cv::IMREAD_COLOR | orientation;
  int reduce = 1;
  const bool jpeg = bytes.size() > 2 && bytes[0] == 0xFF && bytes[1] == 0xD8;
  if (opts.reduced_decode && jpeg && source_w > 0 && source_h > 0) {
    for (int f : {8, 4, 2}) {
      if (source_w / f >= tw && source_h / f >= th) {
        reduce = f;
        break;
      }
    }
    if (reduce == 2) flags = cv::IMREAD_REDUCED_COLOR_2 | orientation;
    if (reduce == 4) flags = cv::IMREAD_REDUCED_COLOR_4 | orientation;
    if (reduce == 8) flags = cv::IMREAD_REDUCED_COLOR_8 | orientation;
  }
  // A progressive JPEG at 1/8: its DC scans alone give the same pixels (jpeg_dc.h).
  cv::Mat bgr = reduce == 8 ? decode_progressive_eighth(bytes.data(), bytes.size()) : cv::Mat();
  if (is_png(bytes.data(), bytes.size())) {
    // libpng through our handlers: its warnings are counted, said once, never printed.
    PngDecoded png = decode_png(bytes.data(), bytes.size(), opts.exif_orientation);
    if (!png.error.empty()) return bad(BadReason::corrupt, "libpng: " + png.error);
    for (const auto& w : png.warnings) {
      if (record_codec_warning(w)) {
        log::info("'{}': libpng warns '{}'; the image decodes fine (each such warning is said once, and counted)",
                  path, w);
      }
    }
    bgr = png.bgr;
  }
  try {
    if (bgr.empty()) bgr = cv::imdecode(bytes, flags);
  } catch (const cv::Exception& e) {
    return bad(BadReason::corrupt, e.what());
  }
  if (bgr.empty()) {
    const ImageSize s = read_image_size(bytes.data(), bytes.size());
    if (!s.ok) return bad(BadReason::not_an_image, s.error);
    // A format the header reader knows (GIF) but this OpenCV cannot decode. OpenCV asks a
    // file only, so a tar member's failure is reported as the decoder's.
    if (!parse_file_ref(path).in_tar() && !cv::haveImageReader(path)) {
      return bad(BadReason::unsupported, fmt::format("OpenCV {} has no decoder for it; convert such files", CV_VERSION));
    }
    return bad(BadReason::corrupt, "the decoder rejected it");
  }
  DecodedImage out;
  out.reduce = reduce;
  try {
    cv::Mat crop = cover_and_crop(bgr, th, tw, opts.filter.value_or(Resample::bicubic));
    if (flip) cv::flip(crop, crop, 1);
    cv::cvtColor(crop, out.rgb, cv::COLOR_BGR2RGB);
  } catch (const std::exception& e) {
    return bad(BadReason::corrupt, e.what());
  }
  return out;
}

void to_chw_normalized(const cv::Mat& rgb, float* out, bool flip) {
  const int h = rgb.rows, w = rgb.cols;
  const size_t plane = static_cast<size_t>(h) * static_cast<size_t>(w);
  for (int y = 0; y < h; ++y) {
    const uchar* row = rgb.ptr<uchar>(y);
    for (int x = 0; x < w; ++x) {
      const size_t at = static_cast<size_t>(y) * static_cast<size_t>(w) + static_cast<size_t>(x);
      const uchar* px = row + 3 * (flip ? w - 1 - x : x);
      for (int c = 0; c < 3; ++c) {
        out[static_cast<size_t>(c) * plane + at] = px[c] / 127.5f - 1.0f;
      }
    }
  }
}

}  // namespace sana::data
