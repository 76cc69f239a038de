// ReLU linear attention (model/fused/linear_attention.h): what LinearAttentionFn computes
// with ATen in fp32 (model/block_kernels.cpp: ReLU'd copies of q and k, v padded with ones,
// two batched products, a division), reading qkv in its own dtype and layout and keeping
// only the 33 x 32 matrix M per sample and head between the passes. Upstream's Triton
// kernels (diffusion/model/nets/fastlinear/) split the work the same way: a reduction over
// the tokens for M, then the tokens one by one against it.
//
// Per head, d = 32 channels: M = Vp^T K (Vp = [V, 1]), O = Q M^T, out = O[:, :d] / (O[:, d] +
// eps). Backward, from G: dO[:, :d] = G / den, dO[:, d] = -sum_i G_i out_i / den; dQ = dO M,
// dM = dO^T Q, dK = Vp dM, dV = K dM[:d]^T; ReLU's mask on dQ and dK.
//
// The token passes give a token to a warp, lane i holding channel i; M sits in shared memory
// with rows padded to 33 floats, so a warp's reads of a row or a column hit 32 banks.
#include "sana/model/fused/linear_attention.h"
#include "sana/model/fused/element.cuh"

#include <cuda_runtime.h>

#include <type_traits>

namespace sana::model::fused {

namespace {

constexpr int D = kLinearHeadDim;
constexpr int kRows = D + 1;           // M's rows: v's channels and the ones
constexpr int kEntries = kRows * D;    // 1056
constexpr int kStride = D + 1;         // a row of M in shared memory
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileTokens = 128;       // tokens a reduction block stages at once
constexpr int kTilesPerBlock = 4;      // tiles a reduction block sums before its atomics
constexpr int kTokensPerWarp = 8;      // tokens a warp of the token passes takes in turn
constexpr int kTokensPerBlock = kWarps * kTokensPerWarp;

// Element (b, n, part, h, c) of qkv [B, N, 3, H, D].
__device__ __forceinline__ int64_t at_qkv(int64_t b, int64_t n, int part, int h, int c, int64_t N, int H) {
  return (((b * N + n) * 3 + part) * H + h) * D + c;
}

__device__ __forceinline__ float relu(float v) { return v > 0.f ? v : 0.f; }

// M of (b, h) = blockIdx.x, from kTilesPerBlock tiles of tokens starting at blockIdx.y's.
template <typename T>
__global__ void __launch_bounds__(kThreads) reduce_m_kernel(const T* qkv, float* m, int64_t N, int H) {
  __shared__ float ks[kTileTokens][kStride], vs[kTileTokens][kStride];
  const int64_t b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  float acc[(kEntries + kThreads - 1) / kThreads] = {};
  for (int tile = 0; tile < kTilesPerBlock; ++tile) {
    const int64_t n0 = (static_cast<int64_t>(blockIdx.y) * kTilesPerBlock + tile) * kTileTokens;
    if (n0 >= N) break;
    __syncthreads();  // the previous tile's reads are done
    for (int e = threadIdx.x; e < kTileTokens * D; e += kThreads) {
      const int t = e / D, c = e % D;
      const int64_t n = n0 + t;
      ks[t][c] = n < N ? relu(load(qkv, at_qkv(b, n, 1, h, c, N, H))) : 0.f;
      vs[t][c] = n < N ? load(qkv, at_qkv(b, n, 2, h, c, N, H)) : 0.f;
    }
    __syncthreads();
    const int tokens = N - n0 < kTileTokens ? static_cast<int>(N - n0) : kTileTokens;
#pragma unroll
    for (int r = 0; r < (kEntries + kThreads - 1) / kThreads; ++r) {
      const int e = threadIdx.x + r * kThreads;
      if (e >= kEntries) continue;
      const int i = e / D, j = e % D;
      float s = 0;
      if (i < D) {
        for (int t = 0; t < tokens; ++t) s += vs[t][i] * ks[t][j];
      } else {
        for (int t = 0; t < tokens; ++t) s += ks[t][j];  // the ones row
      }
      acc[r] += s;
    }
  }
#pragma unroll
  for (int r = 0; r < (kEntries + kThreads - 1) / kThreads; ++r) {
    const int e = threadIdx.x + r * kThreads;
    if (e < kEntries) atomicAdd(m + static_cast<int64_t>(blockIdx.x) * kEntries + e, acc[r]);
  }
}

// M of (b, h) into shared memory, rows padded (ms[i * kStride + j]).
__device__ __forceinline__ void stage_m(const float* m, float* ms) {
  for (int e = threadIdx.x; e < kEntries; e += blockDim.x) ms[(e / D) * kStride + e % D] = m[e];
  __syncthreads();
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Lane i's o_i = sum_j q_j M[i][j] and den = sum_j q_j M[D][j] + eps, with q_j in lane j.
__device__ __forceinline__ void attend(const float* ms, float q, float eps, float& o, float& den) {
  o = 0;
  den = eps;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < D; ++j) {
    const float qj = __shfl_sync(0xffffffffu, q, j);
    o += qj * ms[lane * kStride + j];
    den += qj * ms[D * kStride + j];
  }
}

// grid (B * H, ceil(N / kTokensPerBlock)): out for a warp's tokens.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    output_kernel(const T* qkv, const float* m, float* out, int64_t N, int H, float eps) {
  __shared__ float ms[kRows * kStride];
  const int64_t b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  stage_m(m + static_cast<int64_t>(blockIdx.x) * kEntries, ms);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k = 0; k < kTokensPerWarp; ++k) {
    const int64_t n = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock + warp * kTokensPerWarp + k;
    if (n >= N) break;
    float o, den;
    attend(ms, relu(load(qkv, at_qkv(b, n, 0, h, lane, N, H))), eps, o, den);
    out[((b * N + n) * H + h) * D + lane] = o / den;
  }
}

// The backward's first pass: dQ per token, and dM summed over the block's tokens (lane j
// keeps column j of its warp's sum; the warps' sums meet in shared memory, then one atomic
// add per entry).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    query_grad_kernel(const T* qkv, const float* m, const float* grad, float* d_m, T* d_qkv, int64_t N, int H,
                      float eps) {
  __shared__ float ms[kRows * kStride];
  __shared__ float dms[kEntries];
  const int64_t b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  for (int e = threadIdx.x; e < kEntries; e += kThreads) dms[e] = 0;
  stage_m(m + static_cast<int64_t>(blockIdx.x) * kEntries, ms);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float column[kRows] = {};  // this lane's column j = lane of dM
  for (int k = 0; k < kTokensPerWarp; ++k) {
    const int64_t n = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock + warp * kTokensPerWarp + k;
    if (n >= N) break;
    const float q_raw = load(qkv, at_qkv(b, n, 0, h, lane, N, H)), q = relu(q_raw);
    float o, den;
    attend(ms, q, eps, o, den);
    const float g = grad[((b * N + n) * H + h) * D + lane];
    const float d_value = g / den;                      // dO[:, :d], lane i's
    const float d_ones = -warp_sum(g * (o / den)) / den;  // dO[:, d]
    float dq = d_ones * ms[D * kStride + lane];
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const float di = __shfl_sync(0xffffffffu, d_value, i);
      dq += di * ms[i * kStride + lane];
      column[i] += di * q;
    }
    column[D] += d_ones * q;
    store(d_qkv, at_qkv(b, n, 0, h, lane, N, H), q_raw > 0.f ? dq : 0.f);
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) atomicAdd(&dms[i * D + lane], column[i]);
  __syncthreads();
  for (int e = threadIdx.x; e < kEntries; e += kThreads) {
    atomicAdd(d_m + static_cast<int64_t>(blockIdx.x) * kEntries + e, dms[e]);
  }
}

// The backward's second pass: dK = Vp dM and dV = K dM[:d]^T per token.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    key_value_grad_kernel(const T* qkv, const float* d_m, T* d_qkv, int64_t N, int H) {
  __shared__ float dms[kRows * kStride];
  const int64_t b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  stage_m(d_m + static_cast<int64_t>(blockIdx.x) * kEntries, dms);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k = 0; k < kTokensPerWarp; ++k) {
    const int64_t n = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock + warp * kTokensPerWarp + k;
    if (n >= N) break;
    const float k_raw = load(qkv, at_qkv(b, n, 1, h, lane, N, H)), kk = relu(k_raw);
    const float v = load(qkv, at_qkv(b, n, 2, h, lane, N, H));
    float dk = dms[D * kStride + lane], dv = 0;  // the ones row of Vp
#pragma unroll
    for (int i = 0; i < D; ++i) {
      dk += __shfl_sync(0xffffffffu, v, i) * dms[i * kStride + lane];
      dv += __shfl_sync(0xffffffffu, kk, i) * dms[lane * kStride + i];
    }
    store(d_qkv, at_qkv(b, n, 1, h, lane, N, H), k_raw > 0.f ? dk : 0.f);
    store(d_qkv, at_qkv(b, n, 2, h, lane, N, H), dv);
  }
}

bool bad_shape(int64_t batch, int64_t tokens, int heads) {
  return batch < 0 || tokens < 0 || heads <= 0 || batch * heads > 0x7fffffff;
}

dim3 token_grid(int64_t batch, int64_t tokens, int heads) {
  return dim3(static_cast<unsigned>(batch * heads), static_cast<unsigned>((tokens + kTokensPerBlock - 1) / kTokensPerBlock));
}

}  // namespace

int linear_attention_forward(const void* qkv, ElementType type, float* m, float* out, int64_t batch, int64_t tokens,
                             int heads, float eps, void* stream) {
  if (bad_shape(batch, tokens, heads)) return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  if (const auto e = cudaMemsetAsync(m, 0, sizeof(float) * batch * heads * kEntries, s); e != cudaSuccess) {
    return static_cast<int>(e);
  }
  if (batch * tokens == 0) return 0;
  return with_type(type, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    const int64_t per_block = static_cast<int64_t>(kTileTokens) * kTilesPerBlock;
    const dim3 reduce_grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>((tokens + per_block - 1) / per_block));
    reduce_m_kernel<T><<<reduce_grid, kThreads, 0, s>>>(static_cast<const T*>(qkv), m, tokens, heads);
    if (const auto e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
    output_kernel<T><<<token_grid(batch, tokens, heads), kThreads, 0, s>>>(static_cast<const T*>(qkv), m, out, tokens,
                                                                            heads, eps);
    return static_cast<int>(cudaGetLastError());
  });
}

int linear_attention_backward(const void* qkv, ElementType type, const float* m, const float* grad, float* d_m,
                              void* d_qkv, int64_t batch, int64_t tokens, int heads, float eps, void* stream) {
  if (bad_shape(batch, tokens, heads)) return static_cast<int>(cudaErrorInvalidValue);
  if (batch * tokens == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return with_type(type, [&](auto* tp) {
    using T = std::remove_pointer_t<decltype(tp)>;
    query_grad_kernel<T><<<token_grid(batch, tokens, heads), kThreads, 0, s>>>(
        static_cast<const T*>(qkv), m, grad, d_m, static_cast<T*>(d_qkv), tokens, heads, eps);
    if (const auto e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
    key_value_grad_kernel<T><<<token_grid(batch, tokens, heads), kThreads, 0, s>>>(
        static_cast<const T*>(qkv), d_m, static_cast<T*>(d_qkv), tokens, heads);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace sana::model::fused
