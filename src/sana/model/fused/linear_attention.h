// SanaMS's ReLU linear attention as CUDA kernels (model/fused/layer_norm_modulate.h's
// conventions: raw device pointers, ElementType codes, a CUDA error code back, 0 when
// launched). Heads of kLinearHeadDim channels only (every Sana model's linear_head_dim).
#pragma once

#include <cstdint>

#include "sana/model/fused/layer_norm_modulate.h"

namespace sana::model::fused {

constexpr int kLinearHeadDim = 32;

// qkv: [B, N, 3, H, 32] contiguous (`type`). Per sample and head, with q, k through ReLU and
// v padded with a one: M = sum_n [v_n, 1] k_n^T (fp32 [B, H, 33, 32], written here: the
// backward takes it), and out_n = (M[:32] q_n) / (M[32] . q_n + eps), fp32 [B, N, H, 32].
int linear_attention_forward(const void* qkv, ElementType type, float* m, float* out, int64_t batch,
                             int64_t tokens, int heads, float eps, void* stream);

// From grad = dL/dout (fp32 [B, N, H, 32]) and the forward's M: d_qkv ([B, N, 3, H, 32],
// `type`). d_m: fp32 [B, H, 33, 32] scratch the caller zeroes.
int linear_attention_backward(const void* qkv, ElementType type, const float* m, const float* grad, float* d_m,
                              void* d_qkv, int64_t batch, int64_t tokens, int heads, float eps, void* stream);

}  // namespace sana::model::fused
