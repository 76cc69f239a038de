#include "sana/data/resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace sana::data {

namespace {

// Two bits above 8 bits of pixel and 22 of fraction: a filter's negative lobes can take a
// sum below 0 or above 255 before clipping (Pillow's PRECISION_BITS).
constexpr int kFractionBits = 32 - 8 - 2;

double box_kernel(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }

double triangle_kernel(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double cubic_kernel(double x) {  // Keys' cubic with a = -0.5
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

double lanczos_kernel(double x) { return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0; }

struct Kernel {
  double (*at)(double);
  double support;
};

Kernel kernel_of(Resample r) {
  switch (r) {
    case Resample::box: return {box_kernel, 0.5};
    case Resample::bilinear: return {triangle_kernel, 1.0};
    case Resample::bicubic: return {cubic_kernel, 2.0};
    case Resample::lanczos: return {lanczos_kernel, 3.0};
  }
  throw std::invalid_argument("unknown resample filter");
}

// For each output position in [begin, end) of a 1-D resize from `in_size` to `out_size`:
// the first input position it reads, how many, and their fixed-point weights.
struct Taps {
  int width = 0;                 // weights stored per output position
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // (end - begin) x width
  const int32_t* of(int i) const { return weights.data() + static_cast<size_t>(i) * static_cast<size_t>(width); }
};

Taps make_taps(int in_size, int out_size, int begin, int end, Resample r) {
  const Kernel kernel = kernel_of(r);
  const double scale = static_cast<double>(in_size) / out_size;
  const double stretch = std::max(scale, 1.0);  // shrinking widens the kernel: antialiasing
  const double support = kernel.support * stretch;
  Taps t;
  t.width = static_cast<int>(std::ceil(support)) * 2 + 1;
  const int n = end - begin;
  t.first.resize(static_cast<size_t>(n));
  t.count.resize(static_cast<size_t>(n));
  t.weights.assign(static_cast<size_t>(n) * static_cast<size_t>(t.width), 0);
  std::vector<double> w(static_cast<size_t>(t.width));
  const double inverse = 1.0 / stretch;  // multiplied, not divided: the same last bit as PIL
  for (int i = 0; i < n; ++i) {
    const double center = (begin + i + 0.5) * scale;
    // Truncation toward zero, as the C cast does (a negative start is clamped anyway).
    const int lo = std::max(0, static_cast<int>(center - support + 0.5));
    const int hi = std::min(in_size, static_cast<int>(center + support + 0.5));
    const int count = hi - lo;
    double sum = 0.0;
    for (int x = 0; x < count; ++x) {
      w[static_cast<size_t>(x)] = kernel.at((x + lo - center + 0.5) * inverse);
      sum += w[static_cast<size_t>(x)];
    }
    int32_t* out = t.weights.data() + static_cast<size_t>(i) * static_cast<size_t>(t.width);
    for (int x = 0; x < count; ++x) {
      const double v = (sum != 0.0 ? w[static_cast<size_t>(x)] / sum : w[static_cast<size_t>(x)]) * (1 << kFractionBits);
      out[x] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    t.first[static_cast<size_t>(i)] = lo;
    t.count[static_cast<size_t>(i)] = count;
  }
  return t;
}

inline uint8_t to_pixel(int32_t acc) {
  return static_cast<uint8_t>(std::clamp(acc >> kFractionBits, 0, 255));
}

// out(y, i) = sum over i's taps x of in(y, taps.first[i] + x).
template <int C>
void horizontal(const cv::Mat& in, cv::Mat& out, const Taps& taps) {
  for (int y = 0; y < out.rows; ++y) {
    const uint8_t* src = in.ptr<uint8_t>(y);
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int i = 0; i < out.cols; ++i) {
      const int32_t* k = taps.of(i);
      const uint8_t* s = src + static_cast<size_t>(taps.first[static_cast<size_t>(i)]) * C;
      int32_t acc[C];
      for (int c = 0; c < C; ++c) acc[c] = 1 << (kFractionBits - 1);  // rounds the shift
      for (int x = 0; x < taps.count[static_cast<size_t>(i)]; ++x) {
        for (int c = 0; c < C; ++c) acc[c] += s[x * C + c] * k[x];
      }
      for (int c = 0; c < C; ++c) dst[i * C + c] = to_pixel(acc[c]);
    }
  }
}

// out(j, x) = sum over j's taps y of in(taps.first[j] - row0 + y, x): `in` starts at the
// source's row `row0`.
template <int C>
void vertical(const cv::Mat& in, int row0, cv::Mat& out, const Taps& taps) {
  const int values = out.cols * C;
  std::vector<int32_t> acc(static_cast<size_t>(values));
  for (int j = 0; j < out.rows; ++j) {
    std::fill(acc.begin(), acc.end(), 1 << (kFractionBits - 1));
    const int32_t* k = taps.of(j);
    for (int y = 0; y < taps.count[static_cast<size_t>(j)]; ++y) {
      const uint8_t* src = in.ptr<uint8_t>(taps.first[static_cast<size_t>(j)] - row0 + y);
      const int32_t w = k[y];
      for (int v = 0; v < values; ++v) acc[static_cast<size_t>(v)] += src[v] * w;
    }
    uint8_t* dst = out.ptr<uint8_t>(j);
    for (int v = 0; v < values; ++v) dst[v] = to_pixel(acc[static_cast<size_t>(v)]);
  }
}

template <int C>
cv::Mat resize_crop_channels(const cv::Mat& image, int rh, int rw, const cv::Rect& keep, Resample r) {
  const int type = CV_MAKETYPE(CV_8U, C);
  // Horizontal first, then vertical, with an 8-bit image between (as PIL). A pass whose
  // size does not change is skipped, as PIL skips it: its taps would be the identity.
  // The source rows the kept output rows read.
  Taps vtaps;
  int row0 = keep.y, row_end = keep.y + keep.height;
  if (rh != image.rows) {
    vtaps = make_taps(image.rows, rh, keep.y, keep.y + keep.height, r);
    row0 = vtaps.first.front();
    row_end = vtaps.first.back() + vtaps.count.back();
  }
  const cv::Mat rows = image.rowRange(row0, row_end);
  cv::Mat wide;
  if (rw != image.cols) {
    wide.create(rows.rows, keep.width, type);
    horizontal<C>(rows, wide, make_taps(image.cols, rw, keep.x, keep.x + keep.width, r));
  } else {
    wide = rows.colRange(keep.x, keep.x + keep.width);
  }
  if (rh == image.rows) return wide.clone();
  cv::Mat out(keep.height, keep.width, type);
  vertical<C>(wide, row0, out, vtaps);
  return out;
}

}  // namespace

Resample parse_resample(const std::string& name) {
  if (name == "area") return Resample::box;
  if (name == "bilinear") return Resample::bilinear;
  if (name == "bicubic") return Resample::bicubic;
  if (name == "lanczos") return Resample::lanczos;
  throw std::invalid_argument("unknown resize filter " + name);
}

const char* resample_name(Resample r) {
  switch (r) {
    case Resample::box: return "area";
    case Resample::bilinear: return "bilinear";
    case Resample::bicubic: return "bicubic";
    case Resample::lanczos: return "lanczos";
  }
  return "?";
}

cv::Mat resize_and_crop(const cv::Mat& image, int rh, int rw, const cv::Rect& keep, Resample r) {
  if (image.depth() != CV_8U || image.channels() < 1 || image.channels() > 4) {
    throw std::invalid_argument("resize_and_crop takes 8-bit images of 1 to 4 channels");
  }
  if (rh <= 0 || rw <= 0 || keep.x < 0 || keep.y < 0 || keep.width <= 0 || keep.height <= 0 ||
      keep.x + keep.width > rw || keep.y + keep.height > rh) {
    throw std::invalid_argument("resize_and_crop: the kept rectangle is not inside the resized image");
  }
  switch (image.channels()) {
    case 1: return resize_crop_channels<1>(image, rh, rw, keep, r);
    case 2: return resize_crop_channels<2>(image, rh, rw, keep, r);
    case 3: return resize_crop_channels<3>(image, rh, rw, keep, r);
    default: return resize_crop_channels<4>(image, rh, rw, keep, r);
  }
}

}  // namespace sana::data
