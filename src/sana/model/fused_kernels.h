// model.kernels: fused. CUDA kernels for the memory-bound chains of a SanaMS block, each in
// place of an ATen composition that writes and rereads a tensor of the image's size at
// every step (model/fused/*.cu are the kernels). The ATen path stays the CPU's and the
// reference: each kernel's GPU test (tests/unit/model/test_fused_kernels_cuda.cpp, run by
// scripts/gpu_check.sh) holds it against that path on the same inputs.
//
// A fused function runs its kernel only where it applies (a CUDA tensor of a shape it
// takes, no forward-mode tangents, no ComposedKernels); elsewhere the caller's ATen path
// runs, so turning the kernels on never changes a CPU run.
#pragma once

#include <torch/torch.h>

namespace sana::model {

// Whether fused_layer_norm_modulate takes x ([B, N, C], C at most 16384, on CUDA).
bool fused_layer_norm_modulate_applies(const torch::Tensor& x, const torch::Tensor& shift,
                                       const torch::Tensor& scale);

// layer_norm(x, eps, no affine) * (1 + scale) + shift for x [B, N, C] and shift, scale
// [B, 1, C] (any strides), in one pass: the result in the autocast dtype when CUDA's
// autocast is on (what the product after it casts to), else in x's and shift's promoted
// dtype, as ATen's composition. Its backward reads x and the gradient once, for dx, and
// d shift and d scale (fp32 sums, returned in their dtypes).
torch::Tensor fused_layer_norm_modulate(const torch::Tensor& x, const torch::Tensor& shift,
                                        const torch::Tensor& scale, double eps);

// Whether fused_silu_dwconv_glu takes u ([B, h*w, 2H] on CUDA) with this depthwise
// convolution's weight ([2H, 1, 3, 3]) and bias ([2H] or none).
bool fused_silu_dwconv_glu_applies(const torch::Tensor& u, const torch::Tensor& weight, const torch::Tensor& bias,
                                   int64_t h, int64_t w);

// GLUMBConv's middle: for u = [B, h*w, 2H] tokens, a * silu(g) with [a, g] the depthwise 3x3
// convolution (zero padding 1, + bias) of silu(u) laid out as the [B, 2H, h, w] image, a
// the first H channels: [B, h*w, H] in u's dtype, or where CUDA's autocast is on in its
// dtype, with u, the weight and the bias cast to it first (as ATen's convolution casts
// them). Sums in fp32; the backward keeps only u and recomputes the rest.
torch::Tensor fused_silu_dwconv_glu(const torch::Tensor& u, const torch::Tensor& weight, const torch::Tensor& bias,
                                    int64_t h, int64_t w);

// Whether fused_linear_attention takes qkv ([B, N, 3, heads, 32] on CUDA).
bool fused_linear_attention_applies(const torch::Tensor& qkv);

// model/block_kernels.h's linear_attention with fp32 products (model.fp32_attention, the
// default): fp32 [B, N, heads, 32], reading qkv in its own dtype. The backward keeps qkv and
// each head's 33 x 32 matrix, not the ReLU'd and padded copies.
torch::Tensor fused_linear_attention(const torch::Tensor& qkv, double eps);

}  // namespace sana::model
