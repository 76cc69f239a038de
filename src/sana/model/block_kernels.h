// The two parts of a SanaMS block whose autograd graph, composed of ATen operators as
// upstream writes them, spends more time moving data than computing: the linear
// attention's core and GLUMBConv's gate. Each is one autograd function with its own
// backward, on the block's token-major layout ([B, N, ...], as the linear layers produce
// and take it), so neither direction transposes a tensor of the image's size. The maths
// is upstream's (sana_blocks.LiteLA.attn_matmul, GLUMBConv's a * silu(gate)); the tests
// hold both directions against ATen's own composition and finite differences.
#pragma once

#include <torch/torch.h>

namespace sana::model {

// Where the attention's batched products run. per_sample: one product per sample over the
// heads, on the token-major tensors themselves (no copies; what CPUs want). head_major:
// q, k, v copied head-major once and one product over all samples and heads (fewer kernel
// launches; what GPUs want). automatic: per_sample on CPU, head_major elsewhere.
enum class AttentionLayout { automatic, per_sample, head_major };

// ReLU linear attention of qkv = [B, N, 3, heads, head_dim] (q, k, v as the qkv linear
// lays them out; any strides): per head, out_n = sum_m v_m (k_m . q_n) / (sum_m k_m . q_n
// + eps) with k, q through ReLU, computed as upstream does (v padded with a row of ones,
// then two products). Returns [B, N, heads, head_dim], float32 when the products ran in
// half precision. fp32: the products in float32 with autocast off (model.fp32_attention);
// else in the autocast dtype when autocast is on.
torch::Tensor linear_attention(const torch::Tensor& qkv, double eps, bool fp32,
                               AttentionLayout layout = AttentionLayout::automatic);

// GLUMBConv's gate: t = [..., 2H] -> t[..., :H] * silu(t[..., H:]), [..., H].
torch::Tensor glu_gate(const torch::Tensor& t);

// The two functions above have reverse-mode derivatives only (ATen's forward-mode AD does
// not see through an autograd function's own backward). While a ComposedKernels lives on
// this thread they compute the same maths as a composition of ATen operators instead,
// which forward-mode AD differentiates exactly: the JVP of model/trigflow.h holds one.
class ComposedKernels {
 public:
  ComposedKernels();
  ~ComposedKernels();
  ComposedKernels(const ComposedKernels&) = delete;
  ComposedKernels& operator=(const ComposedKernels&) = delete;
  static bool active();

 private:
  bool outer_;
};

}  // namespace sana::model
