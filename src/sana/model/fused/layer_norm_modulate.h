// The CUDA kernels of model.kernels: fused, as plain launches on raw device pointers (no
// LibTorch in the .cu files, so nvcc compiles them in seconds); model/fused_kernels.cpp
// wraps them in autograd functions. Element types: the ElementType codes below.
#pragma once

#include <cstdint>

namespace sana::model::fused {

enum class ElementType : int { f32 = 0, bf16 = 1, f16 = 2 };

// The widest row layer_norm_modulate takes (its threads keep a row in registers).
constexpr int kModulateMaxChannels = 16384;

// y[b, n, :] = layer_norm(x[b, n, :]) (no affine, eps) * (1 + scale[b, :]) + shift[b, :],
// computed in fp32 and rounded once to y's type; mean and rstd (fp32, [B * N]) are kept for
// the backward. shift and scale are fp32 [B, C], contiguous. Returns a CUDA error code (0:
// launched).
int layer_norm_modulate_forward(const void* x, ElementType x_type, const float* shift, const float* scale,
                                void* y, ElementType y_type, float* mean, float* rstd, int64_t batch,
                                int64_t tokens, int channels, float eps, void* stream);

// From g = dL/dy (g_type): dx (x's type, [B, N, C]) and, accumulated into the fp32 [B, C]
// buffers d_shift and d_scale (zeroed by the caller), their gradients.
int layer_norm_modulate_backward(const void* x, ElementType x_type, const void* g, ElementType g_type,
                                 const float* scale, const float* mean, const float* rstd, void* dx,
                                 float* d_shift, float* d_scale, int64_t batch, int64_t tokens, int channels,
                                 void* stream);

}  // namespace sana::model::fused
