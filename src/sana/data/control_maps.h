// Control maps for ControlNet training (docs/controlnet.md), made from each sample's bucket
// image as the loader decodes it: a pure function of those pixels, so of the sample and its
// bucket, whatever the worker, process count or cache; the sample's flip mirrors the map
// with the image. No torch.
#pragma once

#include <opencv2/core.hpp>
#include <string>

namespace sana::data {

// canny: made from the image; dataset: the control image the sample's metadata names (its
// JSONL/CSV `control` field; the loader reads it, control_map() does not apply).
enum class ControlKind { none, canny, dataset };

struct ControlMapOptions {
  ControlKind kind = ControlKind::none;
  double canny_low = 100;   // cv::Canny's hysteresis thresholds (ControlNet's canny annotator's)
  double canny_high = 200;
  std::string describe() const;  // for logs and feature manifests
};

// The control map of an 8-bit RGB bucket image, 8-bit RGB of the same size. canny: OpenCV's
// edges of the RGB image (the strongest channel's gradient), 255 on an edge in all three
// channels, as ControlNet's canny annotator followed by its HWC3.
cv::Mat control_map(const cv::Mat& rgb, const ControlMapOptions& options);

}  // namespace sana::data
