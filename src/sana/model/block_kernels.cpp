#include "sana/model/block_kernels.h"

#include "sana/model/autocast.h"
#include "sana/model/sana_ms.h"

#include <vector>

namespace sana::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtype the attention's products run in: float32 under fp32_attention (float64 stays),
// else what autocast would run a matmul of these inputs in.
at::ScalarType product_dtype(const torch::Tensor& qkv, bool fp32) {
  const auto dt = qkv.scalar_type();
  if (fp32) return dt == torch::kFloat64 ? dt : torch::kFloat32;
  if (dt != torch::kFloat32) return dt;
  if (qkv.is_cuda() && compat::cuda_autocast_enabled()) return compat::cuda_autocast_dtype();
  if (qkv.is_cpu() && compat::cpu_autocast_enabled()) return compat::cpu_autocast_dtype();
  return dt;
}

bool half_precision(at::ScalarType t) { return t == torch::kHalf || t == torch::kBFloat16; }

// The attention's [B, N, heads, k] tensors and their [heads or B*heads, N, k] batches for
// the products: token-major, one batch per sample (per_sample), or head-major, one batch
// of all (blank() lays a tensor out so that batches() are views either way).
struct Layout {
  bool per_sample;
  int64_t B, N, H;

  torch::Tensor blank(int64_t k, const torch::TensorOptions& o) const {
    if (per_sample) return torch::empty({B, N, H, k}, o);
    return torch::empty({B, H, N, k}, o).permute({0, 2, 1, 3});
  }
  std::vector<torch::Tensor> batches(const torch::Tensor& t) const {  // t: [B, N, H, k]
    if (!per_sample) return {t.permute({0, 2, 1, 3}).reshape({B * H, N, t.size(3)})};
    std::vector<torch::Tensor> out;
    for (int64_t b = 0; b < B; ++b) out.push_back(t.select(0, b).permute({1, 0, 2}));
    return out;
  }
  std::vector<torch::Tensor> matrices(const torch::Tensor& t) const {  // t: [B, H, r, c]
    if (!per_sample) return {t.view({B * H, t.size(2), t.size(3)})};
    std::vector<torch::Tensor> out;
    for (int64_t b = 0; b < B; ++b) out.push_back(t.select(0, b));
    return out;
  }
};

// Per head, with Q, K the ReLU'd queries and keys (N x d), Vp = [V, 1] (N x (d+1)):
//   M = Vp^T K ((d+1) x d),  O = Q M^T (N x (d+1)),  out = O[:, :d] / (O[:, d] + eps).
// Backward, from G = d out: dO[:, :d] = G / den, dO[:, d] = -sum_i G_i out_i / den; then
//   dQ = dO M, dM = dO^T Q, dK = Vp dM, dV = K dM[:d]^T, and ReLU's mask on dQ and dK.
struct LinearAttentionFn : public torch::autograd::Function<LinearAttentionFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qkv, double eps, bool fp32,
                               int64_t layout_code) {
    const auto dtype = product_dtype(qkv, fp32);
    const auto out_dtype = half_precision(dtype) ? torch::kFloat32 : dtype;
    NoAutocast off;  // the products run in `dtype`, chosen above
    const int64_t B = qkv.size(0), N = qkv.size(1), H = qkv.size(3), D = qkv.size(4);
    const auto layout_kind = static_cast<AttentionLayout>(layout_code);
    const Layout L{layout_kind == AttentionLayout::automatic ? qkv.is_cpu() : layout_kind == AttentionLayout::per_sample,
                   B, N, H};
    const auto x = qkv.to(dtype);
    const auto o = x.options();
    auto q = L.blank(D, o), k = L.blank(D, o), vp = L.blank(D + 1, o), O = L.blank(D + 1, o);
    at::clamp_min_out(q, x.select(2, 0), 0);  // ReLU
    at::clamp_min_out(k, x.select(2, 1), 0);
    vp.narrow(3, 0, D).copy_(x.select(2, 2));
    vp.narrow(3, D, 1).fill_(1);
    auto M = torch::empty({B, H, D + 1, D}, o);
    const auto qs = L.batches(q), ks = L.batches(k), vs = L.batches(vp);
    auto os = L.batches(O), ms = L.matrices(M);
    for (size_t i = 0; i < qs.size(); ++i) {
      at::bmm_out(ms[i], vs[i].transpose(1, 2), ks[i]);
      at::bmm_out(os[i], qs[i], ms[i].transpose(1, 2));
    }
    if (FlopTrace::active()) FlopTrace::add(4.0 * static_cast<double>(B * H * N) * static_cast<double>((D + 1) * D));
    const auto Of = O.to(out_dtype);
    const auto den = Of.narrow(3, D, 1) + eps;
    auto out = torch::empty({B, N, H, D}, o.dtype(out_dtype));
    at::div_out(out, Of.narrow(3, 0, D), den);
    ctx->save_for_backward({q, k, vp, M, den, out});
    ctx->saved_data["per_sample"] = L.per_sample;
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(qkv.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &vp = saved[2], &M = saved[3], &den = saved[4], &out = saved[5];
    const auto dtype = q.scalar_type();
    const int64_t B = q.size(0), N = q.size(1), H = q.size(2), D = q.size(3);
    const Layout L{ctx->saved_data["per_sample"].toBool(), B, N, H};
    torch::NoGradGuard no_grad;
    NoAutocast off;
    const auto& G = grads[0];
    auto dO = L.blank(D + 1, out.options());
    auto d_values = dO.narrow(3, 0, D), d_ones = dO.narrow(3, D, 1);
    at::div_out(d_values, G, den);
    at::div_out(d_ones, -(G * out).sum(3, true), den);
    dO = dO.to(dtype);
    auto dqkv = torch::empty({B, N, 3, H, D}, q.options());
    auto dq = L.blank(D, q.options()), dk = L.blank(D, q.options());
    auto dv = L.per_sample ? dqkv.select(2, 2) : L.blank(D, q.options());
    auto dM = torch::empty({B, H, D + 1, D}, q.options());
    const auto dos = L.batches(dO), qs = L.batches(q), ks = L.batches(k), vs = L.batches(vp), ms = L.matrices(M);
    auto dqs = L.batches(dq), dks = L.batches(dk), dvs = L.batches(dv), dms = L.matrices(dM);
    for (size_t i = 0; i < qs.size(); ++i) {
      at::bmm_out(dqs[i], dos[i], ms[i]);
      at::bmm_out(dms[i], dos[i].transpose(1, 2), qs[i]);
      at::bmm_out(dvs[i], ks[i], dms[i].narrow(1, 0, D).transpose(1, 2));
      at::bmm_out(dks[i], vs[i], dms[i]);
    }
    if (!L.per_sample) dqkv.select(2, 2).copy_(dv);
    auto dq_in = dqkv.select(2, 0), dk_in = dqkv.select(2, 1);
    at::threshold_backward_out(dq_in, dq, q, 0);  // ReLU: zero where its output is
    at::threshold_backward_out(dk_in, dk, k, 0);
    const auto input_dtype = static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    return {dqkv.to(input_dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// out = a * silu(g) for t = [a, g] on the last dimension; the backward writes both halves
// of t's gradient into one tensor (the slices' own backward would build two zero-padded
// tensors and add them, or a cat).
struct GluGateFn : public torch::autograd::Function<GluGateFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& t) {
    const int64_t H = t.size(-1) / 2;
    const auto s = torch::silu(t.narrow(-1, H, H));
    ctx->save_for_backward({t, s});
    return (t.narrow(-1, 0, H) * s).contiguous();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &t = saved[0], &s = saved[1];
    const auto& G = grads[0];
    const int64_t H = t.size(-1) / 2;
    torch::NoGradGuard no_grad;
    auto dt = torch::empty(t.sizes(), t.options());
    auto da = dt.narrow(-1, 0, H), dg = dt.narrow(-1, H, H);
    at::mul_out(da, G, s);
    at::silu_backward_out(dg, G * t.narrow(-1, 0, H), t.narrow(-1, H, H));
    return {dt};
  }
};

thread_local bool g_composed = false;

// LinearAttentionFn's forward as ATen operators, head-major: what forward-mode AD runs.
torch::Tensor composed_linear_attention(const torch::Tensor& qkv, double eps, bool fp32) {
  const auto dtype = product_dtype(qkv, fp32);
  const auto out_dtype = half_precision(dtype) ? torch::kFloat32 : dtype;
  NoAutocast off;
  const int64_t B = qkv.size(0), N = qkv.size(1), H = qkv.size(3), D = qkv.size(4);
  const auto x = qkv.to(dtype).permute({2, 0, 3, 1, 4});  // [3, B, H, N, D]
  const auto q = torch::relu(x[0]), k = torch::relu(x[1]), v = x[2];
  const auto vp = torch::cat({v, torch::ones({B, H, N, 1}, v.options())}, 3);  // [B, H, N, D+1]
  const auto M = torch::matmul(vp.transpose(2, 3), k);                         // [B, H, D+1, D]
  const auto O = torch::matmul(q, M.transpose(2, 3)).to(out_dtype);             // [B, H, N, D+1]
  if (FlopTrace::active()) FlopTrace::add(4.0 * static_cast<double>(B * H * N) * static_cast<double>((D + 1) * D));
  return (O.narrow(3, 0, D) / (O.narrow(3, D, 1) + eps)).permute({0, 2, 1, 3});
}

}  // namespace

ComposedKernels::ComposedKernels() : outer_(g_composed) { g_composed = true; }
ComposedKernels::~ComposedKernels() { g_composed = outer_; }
bool ComposedKernels::active() { return g_composed; }

torch::Tensor linear_attention(const torch::Tensor& qkv, double eps, bool fp32, AttentionLayout layout) {
  TORCH_CHECK(qkv.dim() == 5 && qkv.size(2) == 3, "linear_attention takes [B, N, 3, heads, head_dim], got ",
              qkv.sizes());
  if (g_composed) return composed_linear_attention(qkv, eps, fp32);
  return LinearAttentionFn::apply(qkv, eps, fp32, static_cast<int64_t>(layout));
}

torch::Tensor glu_gate(const torch::Tensor& t) {
  TORCH_CHECK(t.size(-1) % 2 == 0, "glu_gate takes an even last dimension, got ", t.sizes());
  if (g_composed) {
    const int64_t H = t.size(-1) / 2;
    return t.narrow(-1, 0, H) * torch::silu(t.narrow(-1, H, H));
  }
  return GluGateFn::apply(t);
}

}  // namespace sana::model
