// The block's own autograd functions (model/block_kernels.h) and the token-major GLUMBConv
// against ATen's composition of the same maths as upstream writes it (head-major
// transposes, the padded value row, slices and a channels-first image), forward and
// backward, in float64 and float32, on both attention layouts.
#include "catch.h"
#include <torch/torch.h>

#include "sana/model/block_kernels.h"
#include "sana/model/sana_ms.h"
#include "model_specs.h"

using namespace sana::model;

namespace {

using sana::test::rel_diff;

// Upstream's LiteLA.attn_matmul on head-major [B, heads, d, N] tensors, by ATen's autograd.
torch::Tensor upstream_attention(const torch::Tensor& qkv, double eps) {
  const auto q = torch::relu(qkv.select(2, 0).permute({0, 2, 3, 1}));
  const auto k = torch::relu(qkv.select(2, 1).permute({0, 2, 3, 1}));
  const auto v = torch::constant_pad_nd(qkv.select(2, 2).permute({0, 2, 3, 1}), {0, 0, 0, 1}, 1.0);
  const auto out = torch::matmul(torch::matmul(v, k.transpose(-1, -2)), q);
  const int64_t d = q.size(2);
  return (out.narrow(2, 0, d) / (out.narrow(2, d, 1) + eps)).permute({0, 3, 1, 2});  // [B, N, heads, d]
}

}  // namespace

TEST_CASE("the linear attention's function equals upstream's composition, both directions", "[model]") {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    for (auto layout : {AttentionLayout::per_sample, AttentionLayout::head_major}) {
      // A strided qkv, as the product's [B, N, 3C] viewed: some entries negative for ReLU.
      const auto base = torch::randn({2, 33, 3 * 3 * 8}, dtype);
      const auto weight = torch::randn({2, 33, 3, 3, 8}, dtype);
      auto ours_in = base.clone().requires_grad_(true), theirs_in = base.clone().requires_grad_(true);
      const auto ours = linear_attention(ours_in.view({2, 33, 3, 3, 8}), 1e-8, true, layout);
      const auto theirs = upstream_attention(theirs_in.view({2, 33, 3, 3, 8}), 1e-8);
      const double tol = dtype == torch::kFloat64 ? 1e-12 : 2e-5;
      INFO("dtype " << dtype << ", layout " << static_cast<int>(layout));
      REQUIRE(ours.sizes() == theirs.sizes());
      CHECK(rel_diff(ours, theirs) < tol);
      (ours * weight.select(2, 0)).sum().backward();
      (theirs * weight.select(2, 0)).sum().backward();
      CHECK(rel_diff(ours_in.grad(), theirs_in.grad()) < tol);
      CHECK(ours_in.grad().abs().sum().item<double>() > 0);
    }
  }
}

TEST_CASE("the attention's two layouts give the same float32 result, under bf16 autocast too", "[model]") {
  torch::manual_seed(4);
  const auto qkv = torch::randn({3, 40, 3, 2, 16});
  const auto a = linear_attention(qkv, 1e-8, true, AttentionLayout::per_sample);
  const auto b = linear_attention(qkv, 1e-8, true, AttentionLayout::head_major);
  CHECK(a.scalar_type() == torch::kFloat32);
  CHECK(rel_diff(a, b) < 1e-6);
  // Half-precision inputs attend in float32 under fp32_attention, and their gradient comes
  // back in their own dtype.
  auto half_in = qkv.to(torch::kBFloat16).requires_grad_(true);
  const auto half_out = linear_attention(half_in, 1e-8, true);
  CHECK(half_out.scalar_type() == torch::kFloat32);
  half_out.sum().backward();
  CHECK(half_in.grad().scalar_type() == torch::kBFloat16);
}

TEST_CASE("GLUMBConv's gate function equals a * silu(g) by ATen's autograd", "[model]") {
  torch::manual_seed(5);
  const auto t = torch::randn({2, 12, 10}, torch::kFloat64);
  const auto w = torch::randn({2, 12, 5}, torch::kFloat64);
  auto ours_in = t.clone().requires_grad_(true), theirs_in = t.clone().requires_grad_(true);
  const auto ours = glu_gate(ours_in);
  const auto theirs = theirs_in.narrow(-1, 0, 5) * torch::silu(theirs_in.narrow(-1, 5, 5));
  CHECK(rel_diff(ours, theirs) < 1e-14);
  (ours * w).sum().backward();
  (theirs * w).sum().backward();
  CHECK(rel_diff(ours_in.grad(), theirs_in.grad()) < 1e-14);
}

TEST_CASE("token-major GLUMBConv equals upstream's channels-first convolutions", "[model]") {
  torch::manual_seed(6);
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    const int64_t B = 2, h = 5, w = 7, C = 6, H = 4;
    GLUMBConv ours(C, H, torch::TensorOptions().dtype(dtype));
    for (auto& p : ours->parameters()) p.data().normal_(0, 0.4);
    const auto x = torch::randn({B, h * w, C}, dtype);
    const auto out = ours->forward(x, h, w);
    // Upstream's GLUMBConv.forward: the image [B, C, h, w], three Conv2d, chunk, SiLU gate.
    auto conv = [](const torch::Tensor& t, const Conv2d& c) {
      return torch::conv2d(t, c->weight, c->bias, 1, c->padding, 1, c->groups);
    };
    auto t = torch::silu(conv(x.reshape({B, h, w, C}).permute({0, 3, 1, 2}), ours->inverted_conv->conv));
    t = conv(t, ours->depth_conv->conv);
    const auto parts = t.chunk(2, 1);
    const auto theirs = conv(parts[0] * torch::silu(parts[1]), ours->point_conv->conv).flatten(2).transpose(1, 2);
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
    INFO("dtype " << dtype);
    CHECK(rel_diff(out, theirs) < tol);
    const auto wgt = torch::randn_like(out);
    const auto params = ours->parameters();
    const auto g_ours = torch::autograd::grad({(out * wgt).sum()}, params);
    const auto g_theirs = torch::autograd::grad({(theirs * wgt).sum()}, params);
    for (size_t i = 0; i < params.size(); ++i) CHECK(rel_diff(g_ours[i], g_theirs[i]) < tol);
  }
}
