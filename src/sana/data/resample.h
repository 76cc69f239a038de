// Resizing as PIL's Image.resize does it for 8-bit images (Pillow's published rules:
// separable filters applied horizontally then vertically, the filter's support widened by
// the reduction factor so shrinking antialiases, coefficients in 22-bit fixed point, an
// 8-bit image between the passes). Upstream trains on PIL's pixels, so these are ours.
// Only the pixels a crop keeps are computed: resize-then-crop costs the crop's area, not
// the resized image's, with the same values. No torch.
#pragma once

#include <opencv2/core.hpp>
#include <string>

namespace sana::data {

// PIL's filters: BOX, BILINEAR, BICUBIC (a = -0.5), LANCZOS (a = 3).
enum class Resample { box, bilinear, bicubic, lanczos };

// "area" (PIL's BOX), "bilinear", "bicubic", "lanczos"; throws std::invalid_argument.
Resample parse_resample(const std::string& name);
const char* resample_name(Resample r);

// The pixels of PIL's `im.resize((resized_w, resized_h), filter)` inside `keep` (a
// rectangle of the resized image), for an 8-bit image of 1 to 4 channels.
cv::Mat resize_and_crop(const cv::Mat& image, int resized_h, int resized_w, const cv::Rect& keep, Resample filter);

}  // namespace sana::data
