// Image decoding for training (OpenCV; PNGs through libpng with our handlers, png_decode.h):
// the way upstream's transform does it: resize to cover the bucket, then center-crop;
// optional horizontal flip; EXIF orientation honoured; grayscale, RGBA, 16-bit and palette
// images become 8-bit RGB. Large sources decode at reduced size (JPEG DCT scaling).
// A bad file is a result with a reason, never an exception. No torch.
#pragma once

#include <opencv2/core.hpp>
#include <string>

namespace sana::data {

enum class BadReason { none, missing, empty, truncated, corrupt, not_an_image, too_large, unsupported };
const char* reason_name(BadReason r);

struct DecodeOptions {
  int interpolation = 2;      // cv::INTER_* (default bicubic)
  bool reduced_decode = true; // decode JPEGs at 1/2, 1/4 or 1/8 when still >= the target
  int max_pixels = 1 << 28;   // larger sources are refused (decompression bombs)
};

// cv::INTER_* for data.interpolation ("area", "bilinear", "bicubic", "lanczos").
int interpolation_flag(const std::string& name);

struct DecodedImage {
  cv::Mat rgb;  // CV_8UC3, target_h x target_w, RGB order
  BadReason bad = BadReason::none;
  std::string detail;
  int reduce = 1;  // the JPEG scale factor used
  bool ok() const { return bad == BadReason::none; }
};

// `source_w`/`source_h`: the size the index recorded (0 if unknown); they only decide
// whether a reduced decode still covers the target.
DecodedImage decode_to_bucket(const std::string& path, int target_h, int target_w, bool flip,
                              const DecodeOptions& opts, int source_w = 0, int source_h = 0);

// The bucket transform alone, on an already decoded BGR image (for benchmarks and tests).
cv::Mat cover_and_crop(const cv::Mat& bgr, int target_h, int target_w, int interpolation);

// 8-bit RGB (h x w x 3) to float CHW in [-1, 1], written to `out` (3*h*w floats);
// `flip`: mirrored left to right (the same values as decoding with flip).
void to_chw_normalized(const cv::Mat& rgb, float* out, bool flip = false);

}  // namespace sana::data
