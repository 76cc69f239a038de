// PNG decoding through libpng with our own error and warning handlers, so that nothing
// reaches stderr (OpenCV's PNG reader lets libpng print "libpng warning: iCCP: known
// incorrect sRGB profile" for every such photo). The transforms are the ones OpenCV 4's
// IMREAD_COLOR asks libpng for, in the same order, so the pixels are bitwise those of
// cv::imdecode (tested on the example photos and on 1/2/4/8/16-bit gray, gray+alpha,
// palette, RGB, RGBA and interlaced files). No torch.
#pragma once

#include <opencv2/core.hpp>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sana::data {

struct PngDecoded {
  cv::Mat bgr;                        // CV_8UC3; empty when `error` is set
  std::string error;                  // libpng's reason the file cannot be decoded
  std::vector<std::string> warnings;  // libpng's warnings (the image decoded anyway)
};

bool is_png(const unsigned char* data, size_t size);

// 8-bit BGR, whatever the file's depth, colour type, palette, alpha or interlacing;
// turned as an eXIf chunk's orientation says when `apply_orientation` (as cv::imdecode does).
PngDecoded decode_png(const unsigned char* data, size_t size, bool apply_orientation = true);

// Codec warnings seen by this process, counted per reason (a warning's text without the
// file-specific part). record_codec_warning() returns true the first time a reason is seen:
// the caller says it once, and the count goes in the run's summary.
bool record_codec_warning(const std::string& reason);
std::map<std::string, int64_t> codec_warning_counts();
// "263 x 'iCCP: known incorrect sRGB profile'; ..." or "" when there were none.
std::string codec_warning_summary();

}  // namespace sana::data
