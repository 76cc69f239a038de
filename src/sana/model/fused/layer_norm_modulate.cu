// layer norm + t2i modulate in one pass (model/fused/layer_norm_modulate.h). A SanaMS block
// runs LayerNorm(eps 1e-6, no affine) then x (1 + scale) + shift twice; under autocast ATen
// writes the normalised row in fp32, reads it back for the modulation, writes that in fp32
// and the next product casts it to bf16: four passes over a [B, N, C] tensor where one read
// and one half-precision write do. The backward likewise reads x and the gradient once.
//
// A block owns one row (forward) or a run of rows of one sample (backward); each of its
// threads keeps channels c = threadIdx.x + k * blockDim.x, k < PER, in registers. PER is the
// least of 4, 8, 16 that covers the row with at most 1024 threads (C = 2240: 4 channels on
// each of 576 threads), so the registers a thread holds stay few.
#include "sana/model/fused/layer_norm_modulate.h"
#include "sana/model/fused/element.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace sana::model::fused {

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr int kRowsPerBackwardBlock = 32;

// The sum of `v` over the block's threads (a multiple of 32), returned to every thread.
// `scratch` holds kMaxWarps floats; the trailing barrier lets the caller reuse it at once.
__device__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// Two sums at once, as block_sum (scratch: 2 * kMaxWarps floats).
__device__ float2 block_sum2(float a, float b, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    scratch[warp] = a;
    scratch[kMaxWarps + warp] = b;
  }
  __syncthreads();
  float2 total{0, 0};
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
    total.x += scratch[w];
    total.y += scratch[kMaxWarps + w];
  }
  __syncthreads();
  return total;
}

// grid: one block per row (b, n); mean and variance by two passes over the registers.
template <int PER, typename TX, typename TY>
__global__ void __launch_bounds__(kMaxThreads)
    forward_kernel(const TX* x, const float* shift, const float* scale, TY* y, float* mean_out, float* rstd_out,
                   int64_t tokens, int channels, float eps) {
  __shared__ float scratch[kMaxWarps];
  const int64_t row = blockIdx.x;
  const int64_t b = row / tokens;
  const TX* xr = x + row * channels;
  float v[PER];
  float sum = 0;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    v[k] = c < channels ? load(xr, c) : 0.f;
    sum += v[k];
  }
  const float mean = block_sum(sum, scratch) / channels;
  float dev = 0;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    const float d = c < channels ? v[k] - mean : 0.f;
    dev += d * d;
  }
  const float rstd = rsqrtf(block_sum(dev, scratch) / channels + eps);
  const float* sh = shift + b * channels;
  const float* sc = scale + b * channels;
  TY* yr = y + row * channels;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < channels) store(yr, c, (v[k] - mean) * rstd * (1.f + sc[c]) + sh[c]);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// grid: (runs of kRowsPerBackwardBlock rows, batch). With xh the normalised row and
// dxh = g (1 + scale): dx = rstd (dxh - mean(dxh) - xh mean(dxh xh)); the block's rows'
// sums of g and g xh go to d_shift and d_scale by one atomic add per channel.
template <int PER, typename TX, typename TG>
__global__ void __launch_bounds__(kMaxThreads)
    backward_kernel(const TX* x, const TG* g, const float* scale, const float* mean, const float* rstd, TX* dx,
                    float* d_shift, float* d_scale, int64_t tokens, int channels) {
  __shared__ float scratch[2 * kMaxWarps];
  const int64_t b = blockIdx.y;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBackwardBlock;
  const int64_t n1 = n0 + kRowsPerBackwardBlock < tokens ? n0 + kRowsPerBackwardBlock : tokens;
  float one_plus_scale[PER], acc_shift[PER], acc_scale[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    one_plus_scale[k] = c < channels ? 1.f + scale[b * channels + c] : 0.f;
    acc_shift[k] = 0;
    acc_scale[k] = 0;
  }
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t row = b * tokens + n;
    const float m = mean[row], r = rstd[row];
    const TX* xr = x + row * channels;
    const TG* gr = g + row * channels;
    float xh[PER], dxh[PER];
    float s1 = 0, s2 = 0;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      const float gv = c < channels ? load(gr, c) : 0.f;
      xh[k] = c < channels ? (load(xr, c) - m) * r : 0.f;
      dxh[k] = gv * one_plus_scale[k];
      acc_shift[k] += gv;
      acc_scale[k] += gv * xh[k];
      s1 += dxh[k];
      s2 += dxh[k] * xh[k];
    }
    const float2 s = block_sum2(s1, s2, scratch);
    const float mean_dxh = s.x / channels, mean_dxh_xh = s.y / channels;
    TX* dxr = dx + row * channels;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < channels) store(dxr, c, r * (dxh[k] - mean_dxh - xh[k] * mean_dxh_xh));
    }
  }
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < channels) {
      atomicAdd(d_shift + b * channels + c, acc_shift[k]);
      atomicAdd(d_scale + b * channels + c, acc_scale[k]);
    }
  }
}

// PER and the threads for a row of `channels` (PER 0: too wide).
struct RowSplit {
  int per, threads;
};
RowSplit split_row(int channels) {
  for (int per : {4, 8, 16}) {
    const int threads = ((channels + per - 1) / per + 31) / 32 * 32;
    if (threads <= kMaxThreads) return {per, threads};
  }
  return {0, 0};
}

template <int PER, typename TX, typename TY>
int launch_forward(const void* x, const float* shift, const float* scale, void* y, float* mean, float* rstd,
                   int64_t batch, int64_t tokens, int channels, float eps, int threads, cudaStream_t stream) {
  forward_kernel<PER, TX, TY><<<static_cast<unsigned>(batch * tokens), threads, 0, stream>>>(
      static_cast<const TX*>(x), shift, scale, static_cast<TY*>(y), mean, rstd, tokens, channels, eps);
  return static_cast<int>(cudaGetLastError());
}

template <int PER, typename TX, typename TG>
int launch_backward(const void* x, const void* g, const float* scale, const float* mean, const float* rstd, void* dx,
                    float* d_shift, float* d_scale, int64_t batch, int64_t tokens, int channels, int threads,
                    cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((tokens + kRowsPerBackwardBlock - 1) / kRowsPerBackwardBlock),
                  static_cast<unsigned>(batch));
  backward_kernel<PER, TX, TG><<<grid, threads, 0, stream>>>(static_cast<const TX*>(x), static_cast<const TG*>(g),
                                                               scale, mean, rstd, static_cast<TX*>(dx), d_shift,
                                                               d_scale, tokens, channels);
  return static_cast<int>(cudaGetLastError());
}

// Calls f(std::integral_constant<int, per>) for per 4, 8 or 16.
template <typename F>
int with_per(int per, F&& f) {
  if (per == 4) return f(std::integral_constant<int, 4>{});
  if (per == 8) return f(std::integral_constant<int, 8>{});
  if (per == 16) return f(std::integral_constant<int, 16>{});
  return static_cast<int>(cudaErrorInvalidValue);
}

// Calls f(std::integral_constant<int, PER>, A*, B*) for the row split of `channels` and the
// C++ types of a and b; cudaErrorInvalidValue for a row too wide. `split` is set.
template <typename F>
int dispatch(int channels, ElementType a, ElementType b, RowSplit& split, F&& f) {
  split = split_row(channels);
  if (channels <= 0 || split.per == 0) return static_cast<int>(cudaErrorInvalidValue);
  return with_per(split.per, [&](auto per) {
    return with_type(a, [&](auto* at) { return with_type(b, [&](auto* bt) { return f(per, at, bt); }); });
  });
}

}  // namespace

int layer_norm_modulate_forward(const void* x, ElementType x_type, const float* shift, const float* scale, void* y,
                                ElementType y_type, float* mean, float* rstd, int64_t batch, int64_t tokens,
                                int channels, float eps, void* stream) {
  if (batch * tokens == 0) return split_row(channels).per == 0 ? static_cast<int>(cudaErrorInvalidValue) : 0;
  RowSplit split{};
  return dispatch(channels, x_type, y_type, split, [&](auto per, auto* xt, auto* yt) {
    using TX = std::remove_pointer_t<decltype(xt)>;
    using TY = std::remove_pointer_t<decltype(yt)>;
    return launch_forward<decltype(per)::value, TX, TY>(x, shift, scale, y, mean, rstd, batch, tokens, channels, eps,
                                                        split.threads, static_cast<cudaStream_t>(stream));
  });
}

int layer_norm_modulate_backward(const void* x, ElementType x_type, const void* g, ElementType g_type,
                                 const float* scale, const float* mean, const float* rstd, void* dx, float* d_shift,
                                 float* d_scale, int64_t batch, int64_t tokens, int channels, void* stream) {
  if (batch * tokens == 0) return split_row(channels).per == 0 ? static_cast<int>(cudaErrorInvalidValue) : 0;
  RowSplit split{};
  return dispatch(channels, x_type, g_type, split, [&](auto per, auto* xt, auto* gt) {
    using TX = std::remove_pointer_t<decltype(xt)>;
    using TG = std::remove_pointer_t<decltype(gt)>;
    return launch_backward<decltype(per)::value, TX, TG>(x, g, scale, mean, rstd, dx, d_shift, d_scale, batch, tokens,
                                                         channels, split.threads, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace sana::model::fused
