// The training decode path (OpenCV, the EXIF orientation ignored or applied, full or
// reduced JPEG decoding, PIL's resampling with each filter, cover and crop to a bucket):
// never throws; a bad file is a result with a reason, a good one is
// exactly the bucket's size. A progressive JPEG decoded at 1/8 from its DC scans has the
// pixels of OpenCV's decode of the whole file wherever that decodes (an AC scan that
// libjpeg refuses is dropped unread, so the DC path may still give the picture).
#include <cstdint>
#include <opencv2/imgcodecs.hpp>
#include <vector>

#include "fuzz_support.h"
#include "sana/data/decode.h"
#include "sana/data/jpeg_dc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sana::fuzz::as_file(data, size, ".img");
  sana::data::DecodeOptions opts;
  opts.max_pixels = 1 << 22;  // keeps each run short; larger sources are refused as too large
  // The settings vary with the input's size, so the corpus covers each of them.
  opts.reduced_decode = (size & 2) != 0;
  opts.exif_orientation = (size & 4) != 0;
  opts.filter = static_cast<sana::data::Resample>((size >> 3) % 4);
  const int h = 16 + (size % 3) * 8, w = 24;
  const auto img = sana::data::decode_to_bucket(path, h, w, (size & 1) != 0, opts);
  if (img.ok() && (img.rgb.rows != h || img.rgb.cols != w || img.rgb.type() != CV_8UC3)) __builtin_trap();
  const cv::Mat dc = sana::data::decode_progressive_eighth(data, size);
  if (!dc.empty()) {
    const cv::Mat whole = cv::imdecode(std::vector<uint8_t>(data, data + size), cv::IMREAD_REDUCED_COLOR_8);
    if (!whole.empty() && (whole.size() != dc.size() || cv::norm(whole, dc, cv::NORM_INF) != 0)) __builtin_trap();
  }
  return 0;
}
