// The fused kernels' element access: loads to fp32 and stores from it, for the three
// ElementType element types (float, __nv_bfloat16, __half), and the dispatch on them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "sana/model/fused/layer_norm_modulate.h"

namespace sana::model::fused {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + expf(-v)); }

// Calls f(T*) with a null pointer of the C++ type of `t` (cudaErrorInvalidValue for none).
template <typename F>
int with_type(ElementType t, F&& f) {
  switch (t) {
    case ElementType::f32: return f(static_cast<float*>(nullptr));
    case ElementType::bf16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case ElementType::f16: return f(static_cast<__half*>(nullptr));
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace sana::model::fused
