// GLUMBConv's middle as one kernel each way (model/fused/layer_norm_modulate.h's conventions:
// raw device pointers, ElementType codes, a CUDA error code back, 0 when launched).
#pragma once

#include <cstdint>

#include "sana/model/fused/layer_norm_modulate.h"

namespace sana::model::fused {

// u: [B, h, w, 2H] tokens (the inverted 1x1 convolution's output, channel-last, contiguous)
// of `type`; weight: fp32 [2H, 9], the depthwise 3x3 kernels row-major; bias: fp32 [2H].
// out [B, h, w, H] (`type`) = a * silu(g), with [a, g] = depthwise3x3(silu(u), zero padding)
// + bias, a the first H channels. Sums in fp32, one rounding at the end.
int silu_dwconv_glu_forward(const void* u, ElementType type, const float* weight, const float* bias, void* out,
                            int64_t batch, int height, int width, int half_channels, void* stream);

// From grad = dL/dout ([B, h, w, H], `type`): d_conv ([B, h, w, 2H], `type`, scratch the
// caller provides), du ([B, h, w, 2H], `type`), and, accumulated into the zeroed fp32
// buffers d_weight [2H, 9] and d_bias [2H], their gradients.
int silu_dwconv_glu_backward(const void* u, const void* grad, ElementType type, const float* weight,
                             const float* bias, void* d_conv, void* du, float* d_weight, float* d_bias, int64_t batch,
                             int height, int width, int half_channels, void* stream);

}  // namespace sana::model::fused
