// Control maps for ControlNet training (docs/controlnet.md), made from each sample's bucket
// image as the loader decodes it: a pure function of those pixels (and, for scribbles, of
// a thickness drawn per (seed, epoch, sample)), so the same whatever the worker, process
// count or cache; the sample's flip mirrors the map with the image. No torch: the HED
// network is a function the train layer provides.
#pragma once

#include <functional>
#include <opencv2/core.hpp>
#include <string>

namespace sana::data {

// canny: OpenCV's edges of the image. hed, scribble: upstream's HED edges (soft), or its
// scribble map of them (tools/controlnet/utils.py get_scribble_map). dataset: the control
// image the sample's metadata names (its JSONL/CSV `control` field; the loader reads it,
// control_map() does not apply). latents: with precomputed latents, the control latent the
// metadata names (`control_latent`, as prepare-features writes it).
enum class ControlKind { none, canny, hed, scribble, dataset, latents };

struct ControlMapOptions {
  ControlKind kind = ControlKind::none;
  double canny_low = 100;   // cv::Canny's hysteresis thresholds (ControlNet's canny annotator's)
  double canny_high = 200;
  // hed, scribble: upstream's HEDdetector on an 8-bit RGB image: its 8-bit one-channel edge
  // map of the same size.
  std::function<cv::Mat(const cv::Mat&)> edges;
  int detect_resolution = 512;  // the network sees the image at this short side (upstream's resize_image)
  int thickness = -1;           // scribble: 0-24; -1: drawn from 0-24 per sample and epoch, as upstream
  std::string describe() const;  // for logs and feature manifests
};

// The control map of an 8-bit RGB bucket image, 8-bit RGB of the same size. canny: OpenCV's
// edges of the RGB image (the strongest channel's gradient), 255 on an edge in all three
// channels, as ControlNet's canny annotator followed by its HWC3. hed, scribble: the HED
// edges at the detection size (and for scribble, upstream's thinning and `thickness`),
// resized back to the image's size as upstream's pipeline resizes a control image
// (bicubic), in all three channels.
cv::Mat control_map(const cv::Mat& rgb, const ControlMapOptions& options, int thickness = 2);

// Upstream's resize_image: the short side to `resolution`, each side then rounded to a
// multiple of 64 (half to even, as numpy), Lanczos when enlarging, area when shrinking.
cv::Mat detection_image(const cv::Mat& rgb, int resolution);
// Upstream's scribble of an 8-bit edge map: nms(edges, 127, 3.0), a Gaussian blur of
// sigma 3, 255 above 4 and 0 elsewhere, then thickness 0 erodes with a 4x4 square and
// thickness t > 1 dilates with a (t / 2)-pixel square.
cv::Mat scribble_of_edges(const cv::Mat& edges, int thickness);

}  // namespace sana::data
