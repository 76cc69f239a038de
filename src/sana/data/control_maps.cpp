#include "sana/data/control_maps.h"

#include <fmt/format.h>

#include <opencv2/imgproc.hpp>
#include <stdexcept>

namespace sana::data {

std::string ControlMapOptions::describe() const {
  switch (kind) {
    case ControlKind::none: return "none";
    case ControlKind::canny: return fmt::format("canny {:g}/{:g}", canny_low, canny_high);
    case ControlKind::dataset: return "the dataset's control images";
  }
  return "?";
}

cv::Mat control_map(const cv::Mat& rgb, const ControlMapOptions& options) {
  if (rgb.type() != CV_8UC3) throw std::invalid_argument("control_map takes an 8-bit RGB image");
  switch (options.kind) {
    case ControlKind::canny: {
      cv::Mat edges, out;
      cv::Canny(rgb, edges, options.canny_low, options.canny_high);
      cv::cvtColor(edges, out, cv::COLOR_GRAY2RGB);
      return out;
    }
    case ControlKind::none:
    case ControlKind::dataset: break;
  }
  throw std::invalid_argument("control_map: " + options.describe() + " are not made from the image");
}

}  // namespace sana::data
