// decode_alpha_to_bucket (data/decode.h): an image's alpha channel as a loss mask
// (train.masked_loss, OneTrainer's masked training reads it the same way).
#include <fmt/format.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <vector>

#include "sana/data/decode.h"
#include "sana/data/file_ref.h"

namespace sana::data {

namespace {

// Formats that can carry an alpha channel: PNG, WebP (RIFF....WEBP), TIFF.
bool may_have_alpha(const std::vector<uchar>& b) {
  const auto starts = [&](std::initializer_list<uchar> sig, size_t at = 0) {
    if (b.size() < at + sig.size()) return false;
    size_t i = at;
    for (uchar c : sig) {
      if (b[i++] != c) return false;
    }
    return true;
  };
  return starts({0x89, 'P', 'N', 'G'}) || (starts({'R', 'I', 'F', 'F'}) && starts({'W', 'E', 'B', 'P'}, 8)) ||
         starts({'I', 'I', 42, 0}) || starts({'M', 'M', 0, 42});
}

DecodedAlpha failed(BadReason r, std::string detail) {
  DecodedAlpha d;
  d.bad = r;
  d.detail = std::move(detail);
  return d;
}

}  // namespace

DecodedAlpha decode_alpha_to_bucket(const std::string& path, int th, int tw, const DecodeOptions& opts) {
  std::vector<uchar> bytes;
  const std::string unreadable = read_ref(path, bytes);
  if (!unreadable.empty()) return failed(BadReason::missing, unreadable);
  DecodedAlpha out;
  if (!may_have_alpha(bytes)) return out;
  cv::Mat image;
  try {
    image = cv::imdecode(bytes, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    return failed(BadReason::corrupt, e.what());
  }
  if (image.empty()) return failed(BadReason::corrupt, "the decoder rejected it");
  if (image.channels() != 4 && image.channels() != 2) return out;  // no alpha
  cv::Mat alpha;
  cv::extractChannel(image, alpha, image.channels() - 1);
  if (alpha.depth() == CV_16U) alpha.convertTo(alpha, CV_8U, 1.0 / 257.0);
  if (alpha.depth() != CV_8U) alpha.convertTo(alpha, CV_8U, 255.0);  // float formats in [0, 1]
  try {
    out.alpha = cover_and_crop(alpha, th, tw, opts.filter.value_or(Resample::bicubic));
  } catch (const std::exception& e) {
    return failed(BadReason::corrupt, e.what());
  }
  return out;
}

}  // namespace sana::data
