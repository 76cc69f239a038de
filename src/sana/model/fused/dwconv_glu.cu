// silu -> depthwise 3x3 -> GLU gate (model/fused/dwconv_glu.h). ATen runs GLUMBConv's middle
// as three kernels over [B, N, 2H] tensors (the 1.6B: 11200 channels), each writing its
// result for the next to read and for the backward to keep; here the forward reads u and
// writes the gate's output, and the backward keeps nothing but u.
//
// A block is 32 channels (threadIdx.x: a warp reads 32 neighbouring channels of one token)
// by 8 image columns (threadIdx.y); each thread walks down its column, keeping the 3x3
// window of the convolution's input in registers, so a token is read from memory three
// times (once per column it neighbours), from cache after the first.
#include "sana/model/fused/dwconv_glu.h"
#include "sana/model/fused/element.cuh"

#include <cuda_runtime.h>

#include <type_traits>

namespace sana::model::fused {

namespace {

constexpr int kLanes = 32;    // channels a block covers
constexpr int kColumns = 8;   // image columns a block covers
constexpr int kTaps = 9;      // a 3x3 kernel, row-major: tap 3 * dy + dx, offsets dy - 1, dx - 1
constexpr int kSums = 2 * kTaps + 2;  // a thread's weight and bias gradient sums: a's, g's

__device__ __forceinline__ float silu(float v) { return v * sigmoid(v); }
__device__ __forceinline__ float silu_grad(float v) {
  const float s = sigmoid(v);
  return s * (1.f + v * (1.f - s));
}

// Row `row` of f(u) at columns x - 1 .. x + 1 of channel c (zero outside the image) into
// dst[0..2]. u: one sample's [h, w, C] tokens.
template <typename T, typename F>
__device__ __forceinline__ void load_row(const T* u, int row, int x, int c, int h, int w, int C, F f, float* dst) {
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    const int xx = x - 1 + s;
    dst[s] = row >= 0 && row < h && xx >= 0 && xx < w ? f(load(u, (static_cast<int64_t>(row) * w + xx) * C + c)) : 0.f;
  }
}

// The window's rows move up one: rows y, y + 1 become y - 1, y.
__device__ __forceinline__ void shift_up(float (&win)[3][3]) {
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    win[0][s] = win[1][s];
    win[1][s] = win[2][s];
  }
}

__device__ __forceinline__ float correlate(const float* k, const float (&win)[3][3]) {
  float v = 0;
#pragma unroll
  for (int t = 0; t < kTaps; ++t) v += k[t] * win[t / 3][t % 3];
  return v;
}

// One thread's walk down image column x for channel pair (c, c + H): both kernels, both
// biases and the 3x3 windows of silu(u) around the current row, which next() moves down.
template <typename T>
struct GateColumn {
  const T* u;  // one sample's [h, w, 2H] tokens
  int x, c, h, w, H;
  float ka[kTaps], kg[kTaps], ba, bg;
  float wa[3][3], wg[3][3];  // silu(u) at rows y - 1 .. y + 1, columns x - 1 .. x + 1

  __device__ GateColumn(const T* u_, const float* weight, const float* bias, int x_, int c_, int h_, int w_, int H_)
      : u(u_), x(x_), c(c_), h(h_), w(w_), H(H_), ba(bias[c_]), bg(bias[c_ + H_]) {
#pragma unroll
    for (int t = 0; t < kTaps; ++t) {
      ka[t] = weight[c * kTaps + t];
      kg[t] = weight[(c + H) * kTaps + t];
    }
    load(-1, wa[1], wg[1]);
    load(0, wa[2], wg[2]);
  }
  __device__ void load(int row, float* a, float* g) const {
    auto act = [](float v) { return silu(v); };
    load_row(u, row, x, c, h, w, 2 * H, act, a);
    load_row(u, row, x, c + H, h, w, 2 * H, act, g);
  }
  // To row y (each row once, in order): the windows around it.
  __device__ void next(int y) {
    shift_up(wa);
    shift_up(wg);
    load(y + 1, wa[2], wg[2]);
  }
  __device__ float a() const { return ba + correlate(ka, wa); }
  __device__ float g() const { return bg + correlate(kg, wg); }
};

// grid (ceil(H / 32), ceil(w / 8), B). Channel c's a and channel c + H's g per token.
template <typename T>
__global__ void __launch_bounds__(kLanes* kColumns)
    forward_kernel(const T* u, const float* weight, const float* bias, T* out, int h, int w, int H) {
  const int c = blockIdx.x * kLanes + threadIdx.x, x = blockIdx.y * kColumns + threadIdx.y;
  if (c >= H || x >= w) return;
  const int64_t b = blockIdx.z;
  GateColumn<T> col(u + b * h * w * 2 * H, weight, bias, x, c, h, w, H);
  for (int y = 0; y < h; ++y) {
    col.next(y);
    const float a = col.a(), g = col.g();
    store(out, ((b * h + y) * w + x) * H + c, a * silu(g));
  }
}

// The backward's first half: per token d_conv = [G silu(g), G a silu'(g)], and the block's
// sums of d_conv (d bias) and d_conv times the window (d weight), reduced over its columns
// in shared memory, then one atomic add per channel and tap.
template <typename T>
__global__ void __launch_bounds__(kLanes* kColumns)
    conv_grad_kernel(const T* u, const T* grad, const float* weight, const float* bias, T* d_conv, float* d_weight,
                     float* d_bias, int h, int w, int H) {
  __shared__ float partial[kColumns][kSums][kLanes];
  const int c = blockIdx.x * kLanes + threadIdx.x, x = blockIdx.y * kColumns + threadIdx.y;
  const bool valid = c < H && x < w;
  const int C = 2 * H;
  const int64_t b = blockIdx.z;
  float sums[kSums];
#pragma unroll
  for (int j = 0; j < kSums; ++j) sums[j] = 0;
  if (valid) {
    GateColumn<T> col(u + b * h * w * C, weight, bias, x, c, h, w, H);
    for (int y = 0; y < h; ++y) {
      col.next(y);
      const float a = col.a(), g = col.g();
      const int64_t token = (b * h + y) * w + x;
      const float G = load(grad, token * H + c);
      const float da = G * silu(g), dg = G * a * silu_grad(g);
      store(d_conv, token * C + c, da);
      store(d_conv, token * C + c + H, dg);
#pragma unroll
      for (int t = 0; t < kTaps; ++t) {
        sums[t] += da * col.wa[t / 3][t % 3];
        sums[kTaps + t] += dg * col.wg[t / 3][t % 3];
      }
      sums[2 * kTaps] += da;
      sums[2 * kTaps + 1] += dg;
    }
  }
#pragma unroll
  for (int j = 0; j < kSums; ++j) partial[threadIdx.y][j][threadIdx.x] = sums[j];
  __syncthreads();
  const int thread = threadIdx.y * kLanes + threadIdx.x;
  for (int e = thread; e < kSums * kLanes; e += kLanes * kColumns) {
    const int j = e / kLanes, lane = e % kLanes, ch = blockIdx.x * kLanes + lane;
    if (ch >= H) continue;
    float total = 0;
    for (int col = 0; col < kColumns; ++col) total += partial[col][j][lane];
    if (j < kTaps) atomicAdd(d_weight + ch * kTaps + j, total);
    else if (j < 2 * kTaps) atomicAdd(d_weight + (ch + H) * kTaps + (j - kTaps), total);
    else atomicAdd(d_bias + ch + (j == 2 * kTaps ? 0 : H), total);
  }
}

// The backward's second half, grid (ceil(2H / 32), ceil(w / 8), B): du = silu'(u) times
// the convolution's transpose of d_conv (the kernel flipped over its window).
template <typename T>
__global__ void __launch_bounds__(kLanes* kColumns)
    input_grad_kernel(const T* u, const T* d_conv, const float* weight, T* du, int h, int w, int C) {
  const int c = blockIdx.x * kLanes + threadIdx.x, x = blockIdx.y * kColumns + threadIdx.y;
  if (c >= C || x >= w) return;
  const int64_t b = blockIdx.z;
  const T* db = d_conv + b * h * w * C;
  float k[kTaps];
#pragma unroll
  for (int t = 0; t < kTaps; ++t) k[t] = weight[c * kTaps + t];
  float win[3][3];  // d_conv at rows y - 1 .. y + 1, columns x - 1 .. x + 1
  auto same = [](float v) { return v; };
  load_row(db, -1, x, c, h, w, C, same, win[1]);
  load_row(db, 0, x, c, h, w, C, same, win[2]);
  for (int y = 0; y < h; ++y) {
    shift_up(win);
    load_row(db, y + 1, x, c, h, w, C, same, win[2]);
    float s = 0;  // sum over taps of k[dy][dx] d_conv[y - (dy - 1)][x - (dx - 1)]
#pragma unroll
    for (int t = 0; t < kTaps; ++t) s += k[t] * win[2 - t / 3][2 - t % 3];
    const int64_t i = ((b * h + y) * w + x) * C + c;
    store(du, i, s * silu_grad(load(u, i)));
  }
}

dim3 grid_for(int channels, int width, int64_t batch) {
  return dim3(static_cast<unsigned>((channels + kLanes - 1) / kLanes),
              static_cast<unsigned>((width + kColumns - 1) / kColumns), static_cast<unsigned>(batch));
}

bool bad_shape(int64_t batch, int height, int width, int half_channels) {
  return batch < 0 || batch > 65535 || height < 0 || width < 0 || half_channels <= 0;
}

}  // namespace

int silu_dwconv_glu_forward(const void* u, ElementType type, const float* weight, const float* bias, void* out,
                            int64_t batch, int height, int width, int half_channels, void* stream) {
  if (bad_shape(batch, height, width, half_channels)) return static_cast<int>(cudaErrorInvalidValue);
  if (batch * height * width == 0) return 0;
  return with_type(type, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    forward_kernel<T><<<grid_for(half_channels, width, batch), dim3(kLanes, kColumns), 0,
                        static_cast<cudaStream_t>(stream)>>>(static_cast<const T*>(u), weight, bias,
                                                             static_cast<T*>(out), height, width, half_channels);
    return static_cast<int>(cudaGetLastError());
  });
}

int silu_dwconv_glu_backward(const void* u, const void* grad, ElementType type, const float* weight,
                             const float* bias, void* d_conv, void* du, float* d_weight, float* d_bias, int64_t batch,
                             int height, int width, int half_channels, void* stream) {
  if (bad_shape(batch, height, width, half_channels)) return static_cast<int>(cudaErrorInvalidValue);
  if (batch * height * width == 0) return 0;
  return with_type(type, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    const auto s = static_cast<cudaStream_t>(stream);
    conv_grad_kernel<T><<<grid_for(half_channels, width, batch), dim3(kLanes, kColumns), 0, s>>>(
        static_cast<const T*>(u), static_cast<const T*>(grad), weight, bias, static_cast<T*>(d_conv), d_weight, d_bias,
        height, width, half_channels);
    if (const auto e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
    input_grad_kernel<T><<<grid_for(2 * half_channels, width, batch), dim3(kLanes, kColumns), 0, s>>>(
        static_cast<const T*>(u), static_cast<const T*>(d_conv), weight, static_cast<T*>(du), height, width,
        2 * half_channels);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace sana::model::fused
