#include "sana/data/control_maps.h"

#include <fmt/format.h>

#include <cmath>
#include <opencv2/imgproc.hpp>
#include <stdexcept>

#include "sana/data/resample.h"

namespace sana::data {

std::string ControlMapOptions::describe() const {
  switch (kind) {
    case ControlKind::none: return "none";
    case ControlKind::canny: return fmt::format("canny {:g}/{:g}", canny_low, canny_high);
    case ControlKind::hed: return fmt::format("HED edges at {} px", detect_resolution);
    case ControlKind::scribble:
      return fmt::format("HED scribbles at {} px, thickness {}", detect_resolution,
                         thickness < 0 ? std::string("0-24 per sample") : std::to_string(thickness));
    case ControlKind::dataset: return "the dataset's control images";
    case ControlKind::latents: return "precomputed control latents";
  }
  return "?";
}

cv::Mat detection_image(const cv::Mat& rgb, int resolution) {
  const double k = static_cast<double>(resolution) / std::min(rgb.rows, rgb.cols);
  const int h = static_cast<int>(std::nearbyint(rgb.rows * k / 64.0)) * 64;
  const int w = static_cast<int>(std::nearbyint(rgb.cols * k / 64.0)) * 64;
  cv::Mat out;
  cv::resize(rgb, out, cv::Size(w, h), 0, 0, k > 1 ? cv::INTER_LANCZOS4 : cv::INTER_AREA);
  return out;
}

cv::Mat scribble_of_edges(const cv::Mat& edges, int thickness) {
  // nms(x, 127, 3.0): a point stays where it is the largest along one of four directions.
  cv::Mat x, y = cv::Mat::zeros(edges.size(), CV_32F);
  edges.convertTo(x, CV_32F);
  cv::GaussianBlur(x, x, cv::Size(0, 0), 3.0);
  const uchar directions[4][9] = {{0, 0, 0, 1, 1, 1, 0, 0, 0},
                                  {0, 1, 0, 0, 1, 0, 0, 1, 0},
                                  {1, 0, 0, 0, 1, 0, 0, 0, 1},
                                  {0, 0, 1, 0, 1, 0, 1, 0, 0}};
  for (const auto& f : directions) {
    cv::Mat dilated;
    cv::dilate(x, dilated, cv::Mat(3, 3, CV_8U, const_cast<uchar*>(f)));
    x.copyTo(y, dilated == x);
  }
  cv::Mat map = y > 127;  // 255 or 0
  cv::GaussianBlur(map, map, cv::Size(0, 0), 3.0);
  map = map > 4;
  if (thickness == 0) {
    cv::erode(map, map, cv::Mat::ones(4, 4, CV_8U));
  } else if (thickness > 1) {
    const int k = thickness / 2;
    cv::dilate(map, map, cv::Mat::ones(k, k, CV_8U));
  }
  return map;
}

cv::Mat control_map(const cv::Mat& rgb, const ControlMapOptions& options, int thickness) {
  if (rgb.type() != CV_8UC3) throw std::invalid_argument("control_map takes an 8-bit RGB image");
  cv::Mat out;
  switch (options.kind) {
    case ControlKind::canny: {
      cv::Mat edges;
      cv::Canny(rgb, edges, options.canny_low, options.canny_high);
      cv::cvtColor(edges, out, cv::COLOR_GRAY2RGB);
      return out;
    }
    case ControlKind::hed:
    case ControlKind::scribble: {
      if (!options.edges) throw std::invalid_argument("control_map: HED maps need the edge network");
      cv::Mat map = options.edges(detection_image(rgb, options.detect_resolution));
      if (options.kind == ControlKind::scribble) map = scribble_of_edges(map, thickness);
      map = resize_and_crop(map, rgb.rows, rgb.cols, cv::Rect(0, 0, rgb.cols, rgb.rows), Resample::bicubic);
      cv::cvtColor(map, out, cv::COLOR_GRAY2RGB);
      return out;
    }
    case ControlKind::none:
    case ControlKind::dataset:
    case ControlKind::latents: break;
  }
  throw std::invalid_argument("control_map: " + options.describe() + " are not made from the image");
}

}  // namespace sana::data
