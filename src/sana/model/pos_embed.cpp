#include "sana/model/pos_embed.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace sana::model {

namespace {

// Grid positions as numpy's float32 arange / (size / base) / pe_interpolation gives them.
std::vector<double> positions(int64_t size, double pe_interpolation, int64_t base_size) {
  const float per_base = static_cast<float>(static_cast<double>(size) / static_cast<double>(base_size));
  const float interp = static_cast<float>(pe_interpolation);
  std::vector<double> out(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) out[static_cast<size_t>(i)] = (static_cast<float>(i) / per_base) / interp;
  return out;
}

}  // namespace

torch::Tensor sincos_pos_embed(int64_t dim, int64_t h, int64_t w, double pe_interpolation, int64_t base_size) {
  if (dim % 4 != 0) throw std::invalid_argument("sincos_pos_embed: the width must be a multiple of 4");
  const int64_t quarter = dim / 4;
  std::vector<double> omega(static_cast<size_t>(quarter));
  for (int64_t k = 0; k < quarter; ++k) {
    omega[static_cast<size_t>(k)] = 1.0 / std::pow(10000.0, static_cast<double>(k) / static_cast<double>(quarter));
  }
  const auto rows = positions(h, pe_interpolation, base_size);
  const auto cols = positions(w, pe_interpolation, base_size);
  auto out = torch::empty({h * w, dim}, torch::kFloat32);
  auto* o = out.data_ptr<float>();
  for (int64_t i = 0; i < h; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      float* row = o + (i * w + j) * dim;
      for (int64_t half = 0; half < 2; ++half) {  // half 0: the column, half 1: the row
        const double p = half == 0 ? cols[static_cast<size_t>(j)] : rows[static_cast<size_t>(i)];
        float* part = row + half * 2 * quarter;
        for (int64_t k = 0; k < quarter; ++k) {
          part[k] = static_cast<float>(std::sin(p * omega[static_cast<size_t>(k)]));
          part[quarter + k] = static_cast<float>(std::cos(p * omega[static_cast<size_t>(k)]));
        }
      }
    }
  }
  return out;
}

}  // namespace sana::model
