// model/fused_kernels.h's autograd functions around model/fused/*.cu's launches.
#include "sana/model/fused_kernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "sana/model/block_kernels.h"
#include "sana/model/fused/dwconv_glu.h"
#include "sana/model/fused/layer_norm_modulate.h"
#include "sana/model/fused/linear_attention.h"
#include "sana/model/sana_ms.h"
#include "sana/torch_compat.h"

namespace sana::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

fused::ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return fused::ElementType::f32;
    case at::kBFloat16: return fused::ElementType::bf16;
    case at::kHalf: return fused::ElementType::f16;
    default: TORCH_CHECK(false, "model.kernels fused: no kernel for ", t, " tensors");
  }
}

bool has_kernel_type(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

void check_launch(int error, const char* kernel) {
  TORCH_CHECK(error == 0, "model.kernels fused: the ", kernel, " kernel did not launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(error)),
              " (model.kernels: aten runs the same maths in ATen)");
}

void* current_stream(const torch::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// [B, 1, C] (any strides) as a contiguous fp32 [B, C].
torch::Tensor per_sample_rows(const torch::Tensor& t) {
  return t.reshape({t.size(0), t.size(-1)}).to(torch::kFloat).contiguous();
}

struct LayerNormModulateFn : public torch::autograd::Function<LayerNormModulateFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& shift,
                               const torch::Tensor& scale, double eps, int64_t out_code) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
    const auto out_dtype = static_cast<at::ScalarType>(out_code);
    const auto xc = x.contiguous();
    const auto sh = per_sample_rows(shift), sc = per_sample_rows(scale);
    auto y = torch::empty({B, N, C}, x.options().dtype(out_dtype));
    auto mean = torch::empty({B * N}, x.options().dtype(torch::kFloat));
    auto rstd = torch::empty_like(mean);
    check_launch(fused::layer_norm_modulate_forward(xc.data_ptr(), element_type(xc.scalar_type()), sh.data_ptr<float>(),
                                                    sc.data_ptr<float>(), y.data_ptr(), element_type(out_dtype),
                                                    mean.data_ptr<float>(), rstd.data_ptr<float>(), B, N,
                                                    static_cast<int>(C), static_cast<float>(eps), current_stream(x)),
                 "layer_norm_modulate forward");
    ctx->save_for_backward({xc, sc, mean, rstd});
    ctx->saved_data["shift_dtype"] = static_cast<int64_t>(shift.scalar_type());
    ctx->saved_data["scale_dtype"] = static_cast<int64_t>(scale.scalar_type());
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &sc = saved[1], &mean = saved[2], &rstd = saved[3];
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
    auto g = grads[0].contiguous();
    if (!has_kernel_type(g.scalar_type())) g = g.to(torch::kFloat);
    auto dx = torch::empty_like(x);
    auto d_shift = torch::zeros({B, C}, x.options().dtype(torch::kFloat));
    auto d_scale = torch::zeros_like(d_shift);
    check_launch(fused::layer_norm_modulate_backward(x.data_ptr(), element_type(x.scalar_type()), g.data_ptr(),
                                                     element_type(g.scalar_type()), sc.data_ptr<float>(),
                                                     mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr(),
                                                     d_shift.data_ptr<float>(), d_scale.data_ptr<float>(), B, N,
                                                     static_cast<int>(C), current_stream(x)),
                 "layer_norm_modulate backward");
    auto as = [&](const torch::Tensor& t, const char* key) {
      return t.view({B, 1, C}).to(static_cast<at::ScalarType>(ctx->saved_data[key].toInt()));
    };
    return {dx.to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt())), as(d_shift, "shift_dtype"),
            as(d_scale, "scale_dtype"), torch::Tensor(), torch::Tensor()};
  }
};

// The depthwise weight [2H, 1, 3, 3] as fp32 [2H, 9], rounded to the autocast dtype first
// where CUDA's autocast is on (what ATen's convolution would compute with).
torch::Tensor taps_of(const torch::Tensor& t) {
  auto v = t.detach();
  if (compat::cuda_autocast_enabled() && v.scalar_type() == at::kFloat) v = v.to(compat::cuda_autocast_dtype());
  return v.reshape({t.size(0), -1}).to(torch::kFloat).contiguous();
}

struct SiluDwconvGluFn : public torch::autograd::Function<SiluDwconvGluFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& u, const torch::Tensor& weight,
                               const torch::Tensor& bias, int64_t h, int64_t w) {
    const c10::cuda::CUDAGuard guard(u.device());
    const int64_t B = u.size(0), H = u.size(2) / 2;
    // Under autocast an fp32 u is cast first, as the convolution casts its input.
    const bool cast = compat::cuda_autocast_enabled() && u.scalar_type() == at::kFloat;
    const auto uc = (cast ? u.to(compat::cuda_autocast_dtype()) : u).contiguous();
    const auto taps = taps_of(weight);
    const auto shift = bias.defined() ? taps_of(bias.reshape({-1, 1})).reshape({-1})
                                      : torch::zeros({2 * H}, u.options().dtype(torch::kFloat));
    auto out = torch::empty({B, u.size(1), H}, uc.options());
    check_launch(fused::silu_dwconv_glu_forward(uc.data_ptr(), element_type(uc.scalar_type()), taps.data_ptr<float>(),
                                                shift.data_ptr<float>(), out.data_ptr(), B, static_cast<int>(h),
                                                static_cast<int>(w), static_cast<int>(H), current_stream(u)),
                 "silu_dwconv_glu forward");
    ctx->save_for_backward({uc, taps, shift});
    ctx->saved_data["h"] = h;
    ctx->saved_data["w"] = w;
    ctx->saved_data["u_dtype"] = static_cast<int64_t>(u.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : at::kFloat);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &u = saved[0], &taps = saved[1], &shift = saved[2];
    const c10::cuda::CUDAGuard guard(u.device());
    const int64_t B = u.size(0), H = u.size(2) / 2, h = ctx->saved_data["h"].toInt(), w = ctx->saved_data["w"].toInt();
    const auto g = grads[0].to(u.scalar_type()).contiguous();
    auto d_conv = torch::empty_like(u), du = torch::empty_like(u);
    auto d_taps = torch::zeros_like(taps), d_shift = torch::zeros_like(shift);
    check_launch(fused::silu_dwconv_glu_backward(u.data_ptr(), g.data_ptr(), element_type(u.scalar_type()),
                                                 taps.data_ptr<float>(), shift.data_ptr<float>(), d_conv.data_ptr(),
                                                 du.data_ptr(), d_taps.data_ptr<float>(), d_shift.data_ptr<float>(), B,
                                                 static_cast<int>(h), static_cast<int>(w), static_cast<int>(H),
                                                 current_stream(u)),
                 "silu_dwconv_glu backward");
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    torch::Tensor d_bias;
    if (ctx->saved_data["has_bias"].toBool()) {
      d_bias = d_shift.to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    }
    return {du.to(static_cast<at::ScalarType>(ctx->saved_data["u_dtype"].toInt())),
            d_taps.view({2 * H, 1, 3, 3}).to(weight_dtype), d_bias, torch::Tensor(), torch::Tensor()};
  }
};

struct LinearAttentionFn : public torch::autograd::Function<LinearAttentionFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qkv, double eps) {
    const c10::cuda::CUDAGuard guard(qkv.device());
    const int64_t B = qkv.size(0), N = qkv.size(1), H = qkv.size(3), D = qkv.size(4);
    const auto qc = qkv.contiguous();
    const auto f32 = qkv.options().dtype(torch::kFloat);
    auto m = torch::empty({B, H, D + 1, D}, f32);
    auto out = torch::empty({B, N, H, D}, f32);
    check_launch(fused::linear_attention_forward(qc.data_ptr(), element_type(qc.scalar_type()), m.data_ptr<float>(),
                                                 out.data_ptr<float>(), B, N, static_cast<int>(H),
                                                 static_cast<float>(eps), current_stream(qkv)),
                 "linear_attention forward");
    if (FlopTrace::active()) FlopTrace::add(4.0 * static_cast<double>(B * H * N) * static_cast<double>((D + 1) * D));
    ctx->save_for_backward({qc, m});
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &qkv = saved[0], &m = saved[1];
    const c10::cuda::CUDAGuard guard(qkv.device());
    const int64_t B = qkv.size(0), N = qkv.size(1), H = qkv.size(3);
    const auto g = grads[0].to(torch::kFloat).contiguous();
    auto d_m = torch::zeros_like(m);
    auto d_qkv = torch::empty_like(qkv);
    check_launch(fused::linear_attention_backward(qkv.data_ptr(), element_type(qkv.scalar_type()), m.data_ptr<float>(),
                                                  g.data_ptr<float>(), d_m.data_ptr<float>(), d_qkv.data_ptr(), B, N,
                                                  static_cast<int>(H),
                                                  static_cast<float>(ctx->saved_data["eps"].toDouble()),
                                                  current_stream(qkv)),
                 "linear_attention backward");
    return {d_qkv, torch::Tensor()};
  }
};

bool tangents(const torch::Tensor& t) { return t._fw_grad(0).defined(); }

}  // namespace

bool fused_layer_norm_modulate_applies(const torch::Tensor& x, const torch::Tensor& shift,
                                       const torch::Tensor& scale) {
  if (!x.is_cuda() || x.dim() != 3 || ComposedKernels::active()) return false;
  const int64_t B = x.size(0), C = x.size(2);
  if (C < 1 || C > fused::kModulateMaxChannels || x.numel() == 0) return false;
  for (const auto* m : {&shift, &scale}) {
    if (!m->is_cuda() || m->dim() != 3 || m->size(0) != B || m->size(1) != 1 || m->size(2) != C) return false;
    if (!has_kernel_type(m->scalar_type()) || tangents(*m)) return false;
  }
  return has_kernel_type(x.scalar_type()) && !tangents(x);
}

bool fused_silu_dwconv_glu_applies(const torch::Tensor& u, const torch::Tensor& weight, const torch::Tensor& bias,
                                   int64_t h, int64_t w) {
  if (!u.is_cuda() || u.dim() != 3 || ComposedKernels::active() || !has_kernel_type(u.scalar_type())) return false;
  const int64_t C = u.size(2);
  if (C % 2 != 0 || u.size(1) != h * w || u.size(0) > 65535 || h > (int64_t{1} << 30) || w > (int64_t{1} << 30)) {
    return false;
  }
  if (!weight.is_cuda() || weight.sizes() != at::IntArrayRef{C, 1, 3, 3} || !has_kernel_type(weight.scalar_type())) {
    return false;
  }
  if (bias.defined() && (!bias.is_cuda() || bias.sizes() != at::IntArrayRef{C} || tangents(bias))) return false;
  return !tangents(u) && !tangents(weight);
}

torch::Tensor fused_silu_dwconv_glu(const torch::Tensor& u, const torch::Tensor& weight, const torch::Tensor& bias,
                                    int64_t h, int64_t w) {
  TORCH_CHECK(fused_silu_dwconv_glu_applies(u, weight, bias, h, w),
              "fused_silu_dwconv_glu takes CUDA u [B, h*w, 2H] and a depthwise weight [2H, 1, 3, 3]; got ", u.sizes(),
              " (h ", h, ", w ", w, "), ", weight.sizes());
  return SiluDwconvGluFn::apply(u, weight, bias, h, w);
}

bool fused_linear_attention_applies(const torch::Tensor& qkv) {
  return qkv.is_cuda() && qkv.dim() == 5 && qkv.size(2) == 3 && qkv.size(4) == fused::kLinearHeadDim &&
         qkv.size(0) * qkv.size(3) <= 0x7fffffff && has_kernel_type(qkv.scalar_type()) && !tangents(qkv) &&
         !ComposedKernels::active();
}

torch::Tensor fused_linear_attention(const torch::Tensor& qkv, double eps) {
  TORCH_CHECK(fused_linear_attention_applies(qkv), "fused_linear_attention takes CUDA qkv [B, N, 3, heads, ",
              fused::kLinearHeadDim, "]; got ", qkv.sizes());
  return LinearAttentionFn::apply(qkv, eps);
}

torch::Tensor fused_layer_norm_modulate(const torch::Tensor& x, const torch::Tensor& shift,
                                        const torch::Tensor& scale, double eps) {
  TORCH_CHECK(fused_layer_norm_modulate_applies(x, shift, scale),
              "fused_layer_norm_modulate takes CUDA x [B, N, C] (C <= ", fused::kModulateMaxChannels,
              ") and shift, scale [B, 1, C]; got ", x.sizes(), ", ", shift.sizes(), ", ", scale.sizes());
  const auto out = compat::cuda_autocast_enabled() ? compat::cuda_autocast_dtype()
                                                   : at::promote_types(at::promote_types(x.scalar_type(),
                                                                                         shift.scalar_type()),
                                                                       scale.scalar_type());
  return LayerNormModulateFn::apply(x, shift, scale, eps, static_cast<int64_t>(out));
}

}  // namespace sana::model
