#include "sana/model/stored_weight.h"

#include <torch/autograd.h>

#include <algorithm>
#include <map>
#include <mutex>


namespace sana::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kNf4Block = 64;       // bitsandbytes' blocksize for the weight's codes
constexpr int64_t kNestedBlock = 256;   // and for the absmax codes (quantize_blockwise's default)
constexpr double kFp8Max = 448.0;       // the largest finite float8_e4m3fn
constexpr int64_t kRestoreChunk = int64_t{1} << 20;  // NF4 elements restored at once (a whole number of blocks)

// bitsandbytes' NF4 table (get_4bit_type("nf4"), QLoRA's quantiles of N(0, 1)), sorted.
constexpr float kNf4[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};

// bitsandbytes' signed dynamic map (create_dynamic_map(signed=True), 7 exponent bits), built
// the way it builds it: for exponent i, the midpoints of linspace(0.1, 1, 2^i + 1) in fp32
// times +-10^(i-6), then 0 and 1, sorted.
torch::Tensor build_dynamic_map() {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const auto bounds = torch::linspace(0.1, 1, (int64_t{1} << i) + 1, torch::kFloat32);
    const auto means = (bounds.slice(0, 0, -1) + bounds.slice(0, 1)) / 2.0;
    const double magnitude = std::pow(10.0, -6 + i);
    for (const double sign : {1.0, -1.0}) {
      const auto values = (means * (sign * magnitude)).contiguous();
      data.insert(data.end(), values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return torch::tensor(data, torch::kFloat32);
}

// What NF4 needs on a device, built once per device: the table, the midpoints between its
// values (the rounding's bounds), the byte table (both codes of a packed byte) and the
// dynamic map with its midpoints.
struct Nf4Tables {
  torch::Tensor table, bounds, pairs, dynamic, dynamic_bounds;
};

torch::Tensor midpoints(const torch::Tensor& sorted) { return (sorted.slice(0, 0, -1) + sorted.slice(0, 1)) / 2; }

const Nf4Tables& nf4_tables(const torch::Device& device) {
  static std::mutex mutex;
  static std::map<std::string, Nf4Tables> by_device;
  std::lock_guard<std::mutex> lock(mutex);
  auto& t = by_device[device.str()];
  if (!t.table.defined()) {
    const auto table = torch::from_blob(const_cast<float*>(kNf4), {16}, torch::kFloat32).clone();
    const auto byte = torch::arange(256, torch::kInt64);
    const auto pairs = torch::stack({table.index_select(0, byte.div(16, "floor")), table.index_select(0, byte.remainder(16))}, 1);
    const auto dynamic = build_dynamic_map();
    t = {table.to(device), midpoints(table).to(device), pairs.to(device), dynamic.to(device),
         midpoints(dynamic).to(device)};
  }
  return t;
}

// bitsandbytes' blockwise rounding (its reference backend's quantize_4bit and
// quantize_blockwise): `flat` (fp32) in blocks of `block`, each times 1 / its absmax (the
// last, shorter block divided by it), clamped to [-1, 1] and rounded to the nearest value of
// the sorted table whose midpoints are `bounds` (a tie to the lower one). Returns the codes
// (int32) and each block's absmax (a full block's as found, the short one's at least 1e-38).
std::pair<torch::Tensor, torch::Tensor> blockwise_codes(const torch::Tensor& flat, int64_t block,
                                                        const torch::Tensor& bounds) {
  const int64_t n = flat.numel(), rest = n % block, full = n - rest;
  const auto blocks = flat.slice(0, 0, full).view({-1, block});
  auto absmax = blocks.abs().amax(1);
  auto scaled = torch::clamp(blocks * torch::reciprocal(absmax.clamp_min(1e-38)).view({-1, 1}), -1, 1).view({-1});
  if (rest > 0) {
    const auto tail = flat.slice(0, full);
    const auto tail_max = tail.abs().max().clamp_min(1e-38);
    absmax = torch::cat({absmax, tail_max.view({1})});
    scaled = torch::cat({scaled, torch::clamp(tail / tail_max, -1, 1)});
  }
  return {torch::bucketize(scaled, bounds, /*out_int32=*/true), absmax};
}

// table[codes] times each block's absmax, in fp32 (bitsandbytes' dequantize_blockwise and
// dequantize_4bit), in place on `values` [n].
void scale_blocks(torch::Tensor& values, const torch::Tensor& absmax, int64_t block) {
  const int64_t n = values.numel(), rest = n % block, full = n - rest;
  values.slice(0, 0, full).view({-1, block}).mul_(absmax.slice(0, 0, full / block).view({-1, 1}));
  if (rest > 0) values.slice(0, full).mul_(absmax[full / block]);
}

StoredWeight store_nf4(const torch::Tensor& weight, bool double_quant) {
  StoredWeight s;
  const int64_t n = weight.numel(), blocks = (n + kNf4Block - 1) / kNf4Block;
  if (weight.is_meta()) {
    const auto meta = weight.options();
    s.codes = torch::empty({(n + 1) / 2}, meta.dtype(torch::kByte));
    s.absmax = torch::empty({blocks}, meta.dtype(double_quant ? torch::kByte : torch::kFloat32));
    if (double_quant) {
      s.nested_absmax = torch::empty({(blocks + kNestedBlock - 1) / kNestedBlock}, meta.dtype(torch::kFloat32));
      s.offset = torch::empty({1}, meta.dtype(torch::kFloat32));
    }
    return s;
  }
  const auto& tables = nf4_tables(weight.device());
  auto [q, absmax] = blockwise_codes(weight.detach().reshape({-1}).to(torch::kFloat32), kNf4Block, tables.bounds);
  if (n % 2 != 0) q = torch::cat({q, torch::bucketize(torch::zeros({1}, absmax.options()), tables.bounds, true)});
  const auto bytes = q.to(torch::kByte);
  s.codes = bytes.slice(0, 0, c10::nullopt, 2).bitwise_left_shift(4).bitwise_or(bytes.slice(0, 1, c10::nullopt, 2));
  if (!double_quant) {
    s.absmax = absmax;
    return s;
  }
  s.offset = absmax.mean().view({1});
  auto [nested_q, nested_absmax] = blockwise_codes(absmax - s.offset, kNestedBlock, tables.dynamic_bounds);
  s.absmax = nested_q.to(torch::kByte);
  s.nested_absmax = nested_absmax;
  return s;
}

torch::Tensor restore_nf4(const StoredWeight& s, torch::ScalarType dtype) {
  const auto& tables = nf4_tables(s.codes.device());
  torch::Tensor absmax = s.absmax;
  if (s.dtype == StorageDtype::nf4_dq) {
    absmax = tables.dynamic.index_select(0, s.absmax.to(torch::kInt));
    scale_blocks(absmax, s.nested_absmax, kNestedBlock);
    absmax.add_(s.offset);
  }
  int64_t n = 1;
  for (const auto d : s.shape) n *= d;
  // A chunk at a time into the restored weight: the byte indices and fp32 values of one
  // chunk at once, not of the whole weight.
  auto out = torch::empty({n}, s.codes.options().dtype(dtype));
  for (int64_t start = 0; start < n; start += kRestoreChunk) {
    const int64_t length = std::min(kRestoreChunk, n - start);
    const auto bytes = s.codes.slice(0, start / 2, (start + length + 1) / 2);
    auto values = tables.pairs.index_select(0, bytes.to(torch::kInt)).view({-1}).slice(0, 0, length);
    scale_blocks(values, absmax.slice(0, start / kNf4Block), kNf4Block);
    if (length == n && dtype == torch::kFloat32) return values.view(s.shape);
    out.slice(0, start, start + length).copy_(values);
  }
  return out.view(s.shape);
}

// Per output channel: scale_o = max_i |w_oi| / `largest` (1 for an all-zero row).
torch::Tensor channel_scales(const torch::Tensor& rows, double largest) {
  auto scale = rows.abs().amax(1) / largest;
  return torch::where(scale > 0, scale, torch::ones_like(scale));
}

StoredWeight store_fp8(const torch::Tensor& weight) {
  StoredWeight s;
  if (weight.is_meta()) {
    s.codes = torch::empty(weight.sizes(), weight.options().dtype(torch::kFloat8_e4m3fn));
    s.scale = torch::empty({weight.size(0)}, weight.options().dtype(torch::kFloat32));
    return s;
  }
  const auto rows = weight.detach().to(torch::kFloat32).flatten(1);
  s.scale = channel_scales(rows, kFp8Max);
  s.codes = (rows / s.scale.unsqueeze(1)).clamp(-kFp8Max, kFp8Max).to(torch::kFloat8_e4m3fn).view(weight.sizes());
  return s;
}

// codes times their scales, per output channel, in `dtype` (int8 and fp8).
torch::Tensor per_channel(const torch::Tensor& codes, const torch::Tensor& scale, torch::ScalarType dtype) {
  std::vector<int64_t> shape(static_cast<size_t>(codes.dim()), 1);
  shape[0] = codes.size(0);
  return codes.to(dtype).mul_(scale.to(dtype).view(shape));
}

torch::ScalarType torch_dtype(StorageDtype d) {
  switch (d) {
    case StorageDtype::bf16: return torch::kBFloat16;
    case StorageDtype::fp16: return torch::kHalf;
    default: break;
  }
  return torch::kFloat32;
}

}  // namespace

StoredWeight store_weight(const torch::Tensor& weight, StorageDtype dtype) {
  torch::NoGradGuard no_grad;
  StoredWeight s;
  switch (dtype) {
    case StorageDtype::int8:
      if (weight.is_meta()) {
        s.codes = torch::empty(weight.sizes(), weight.options().dtype(torch::kChar));
        s.scale = torch::empty({weight.size(0)}, weight.options().dtype(torch::kFloat32));
      } else {
        std::tie(s.codes, s.scale) = quantize_int8(weight);
      }
      break;
    case StorageDtype::fp8: s = store_fp8(weight); break;
    case StorageDtype::nf4:
    case StorageDtype::nf4_dq: s = store_nf4(weight, dtype == StorageDtype::nf4_dq); break;
    default: s.codes = weight.detach().to(torch_dtype(dtype)); break;
  }
  s.dtype = dtype;
  s.shape = weight.sizes().vec();
  return s;
}

torch::Tensor restore_weight(const StoredWeight& w, torch::ScalarType dtype) {
  switch (w.dtype) {
    case StorageDtype::int8:
    case StorageDtype::fp8: return per_channel(w.codes, w.scale, dtype);
    case StorageDtype::nf4:
    case StorageDtype::nf4_dq: return restore_nf4(w, dtype);
    default: break;
  }
  return w.codes.to(dtype);
}

std::pair<torch::Tensor, torch::Tensor> quantize_int8(const torch::Tensor& weight) {
  torch::NoGradGuard no_grad;
  const auto rows = weight.detach().to(torch::kFloat32).flatten(1);
  const auto scale = channel_scales(rows, 127.0);
  const auto q = torch::round(rows / scale.unsqueeze(1)).clamp(-127, 127).to(torch::kChar);
  return {q.view(weight.sizes()), scale};
}

torch::Tensor dequantize_int8(const torch::Tensor& q, const torch::Tensor& scale, torch::ScalarType dtype) {
  return per_channel(q, scale, dtype);
}

// stored_weight.h: the most bytes restoring takes at once, computing in fp32: the
// restored copy (int8, fp8: the converted codes scaled in place); for NF4 also one chunk's
// int32 byte indices and fp32 values, and nf4-dq's absmax values, restored first.
int64_t restore_bytes(StorageDtype d, int64_t elements) {
  if (d != StorageDtype::nf4 && d != StorageDtype::nf4_dq) return 4 * elements;
  const int64_t absmax = d == StorageDtype::nf4_dq ? 4 * ((elements + kNf4Block - 1) / kNf4Block) : 0;
  const int64_t chunk = std::min(elements, kRestoreChunk);
  return 4 * elements + (chunk < elements ? 4 * chunk : 0) + 4 * ((chunk + 1) / 2) + absmax;
}

}  // namespace sana::model
