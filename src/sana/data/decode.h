// Image decoding for training (OpenCV; PNGs through libpng with our handlers, png_decode.h)
// into the pixels upstream's transform gives: the whole image decoded, resized with PIL's
// filter to cover the bucket (resample.h), center-cropped; optional horizontal flip;
// grayscale, RGBA, 16-bit and palette images become 8-bit RGB; the EXIF orientation is
// ignored, as PIL ignores it, unless asked for. JPEGs may decode at 1/2-1/8 scale (an
// opt-in speed setting). A bad file is a result with a reason, never an exception. No torch.
#pragma once

#include <opencv2/core.hpp>
#include <optional>
#include <string>

#include "sana/data/resample.h"

namespace sana::data {

enum class BadReason { none, missing, empty, truncated, corrupt, not_an_image, too_large, unsupported };
const char* reason_name(BadReason r);

struct DecodeOptions {
  // data.interpolation; unset: upstream's choice for the bucket's table (filter_for_table).
  std::optional<Resample> filter;
  bool reduced_decode = false;    // data.jpeg_reduced_decode: JPEGs at 1/2, 1/4 or 1/8 when still >= the target
  bool exif_orientation = false;  // data.exif_orientation: turn images as their EXIF says
  int max_pixels = 1 << 28;       // larger sources are refused (decompression bombs)
  // Every setting the pixels depend on, as text (the disk cache's key, feature manifests).
  std::string describe() const;
};

// Upstream's filter for a bucket table: LANCZOS for ASPECT_RATIO_2048 and _2880, BILINEAR
// for the single square bucket (model.multi_scale false), BICUBIC for every other table.
Resample filter_for_table(const std::string& table_name);

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

// An image's alpha channel at the bucket, resized and centre-cropped as decode_to_bucket
// does the image (the same filter; no flip): CV_8UC1 in `alpha`, empty when the file has no
// alpha channel (JPEG, RGB or gray PNG). `bad`/`detail` as decode_to_bucket's.
struct DecodedAlpha {
  cv::Mat alpha;
  BadReason bad = BadReason::none;
  std::string detail;
  bool ok() const { return bad == BadReason::none; }
};
DecodedAlpha decode_alpha_to_bucket(const std::string& path, int target_h, int target_w, const DecodeOptions& opts);

// The bucket transform alone, on an already decoded image (for benchmarks and tests):
// upstream's resize to cover (sizes truncated as its int() does), then torchvision's
// CenterCrop (offsets rounded half to even).
cv::Mat cover_and_crop(const cv::Mat& image, int target_h, int target_w, Resample filter);

// 8-bit RGB (h x w x 3) to float CHW in [-1, 1], written to `out` (3*h*w floats);
// `flip`: mirrored left to right (the same values as decoding with flip).
void to_chw_normalized(const cv::Mat& rgb, float* out, bool flip = false);

}  // namespace sana::data
