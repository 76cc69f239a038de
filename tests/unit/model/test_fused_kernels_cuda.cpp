// model.kernels: fused against the ATen path on the same inputs, on a GPU (the [cuda] cases:
// tests/unit/cuda_cases.sh, scripts/gpu_check.sh; [kernels]: scripts/gpu_perf.sh). Each
// kernel: its output, in the dtype the next product reads, and the gradients of every input
// it takes; then a whole model with the key on against off.
#include "catch.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "sana/model/autocast.h"
#include "sana/model/block_kernels.h"
#include "sana/model/fused_kernels.h"
#include "sana/model/sana_ms.h"
#include "model_specs.h"

using namespace sana::model;

namespace {

struct NormModulateCase {
  torch::Tensor x, table, t0;  // leaves; shift and scale are chunks of table + t0, as in a block
};

NormModulateCase make_case(int64_t B, int64_t N, int64_t C, at::ScalarType x_dtype) {
  const auto o = torch::TensorOptions().device(torch::kCUDA);
  NormModulateCase c;
  c.x = (torch::randn({B, N, C}, o) * 3 + 0.5).to(x_dtype).requires_grad_(true);
  c.table = (torch::randn({6, C}, o) * 0.1).requires_grad_(true);
  c.t0 = torch::randn({B, 6 * C}, o).requires_grad_(true);
  return c;
}

struct Result {
  torch::Tensor out, dx, dtable, dt0;
};

Result run(NormModulateCase& c, bool fused, const AutocastState& amp, const torch::Tensor& g_seed) {
  for (auto* t : {&c.x, &c.table, &c.t0}) t->mutable_grad() = torch::Tensor();
  torch::Tensor out;
  {
    AutocastGuard guard(amp);
    const int64_t B = c.x.size(0), C = c.x.size(2);
    const auto mod = (c.table.unsqueeze(0) + c.t0.reshape({B, 6, C})).chunk(6, 1);
    if (fused) {
      REQUIRE(fused_layer_norm_modulate_applies(c.x, mod[0], mod[1]));
      out = fused_layer_norm_modulate(c.x, mod[0], mod[1], 1e-6);
    } else {  // the block's ATen path, cast as the product after it casts its input
      out = torch::addcmul(mod[0], torch::layer_norm(c.x, {C}, {}, {}, 1e-6), 1 + mod[1]);
      if (amp.enabled) out = out.to(amp.dtype);
    }
  }
  out.backward(g_seed.to(out.scalar_type()));
  return {out.detach(), c.x.grad(), c.table.grad(), c.t0.grad()};
}

}  // namespace

TEST_CASE("fused layer norm + modulate on CUDA: ATen's output and gradients, every dtype", "[cuda][model][kernels]") {
  if (!torch::cuda::is_available()) FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  torch::manual_seed(11);
  struct Shape {
    int64_t B, N, C;
  };
  // The 1.6B's width over rows that are no multiple of a backward block's 32; a narrow row;
  // a row wider than 4 channels a thread covers (8 a thread).
  for (const Shape s : {Shape{3, 77, 2240}, Shape{2, 33, 96}, Shape{2, 40, 4100}}) {
    for (const auto x_dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto amp : {AutocastState{}, autocast_for(torch::Device(torch::kCUDA), at::kBFloat16),
                             autocast_for(torch::Device(torch::kCUDA), at::kHalf)}) {
        auto c = make_case(s.B, s.N, s.C, x_dtype);
        const auto g = torch::randn({s.B, s.N, s.C}, c.table.options());
        const auto ref = run(c, false, amp, g);
        const auto got = run(c, true, amp, g);
        INFO("B " << s.B << " N " << s.N << " C " << s.C << " x " << x_dtype << " autocast "
                  << (amp.enabled ? c10::toString(amp.dtype) : "off"));
        CHECK(got.out.scalar_type() == ref.out.scalar_type());
        // One rounding of the same fp32 value, but for the statistics' summation order; a bf16
        // x without autocast: ATen's layer norm rounds its result to bf16 before the modulation
        // (and its gradient after), the kernel does not.
        const bool bf16_steps = x_dtype == at::kBFloat16 && !amp.enabled;
        const double out_tol = ref.out.scalar_type() == at::kBFloat16 || bf16_steps ? 8e-3
                               : ref.out.scalar_type() == at::kHalf                 ? 1e-3
                                                                                    : 1e-5;
        const double grad_tol = bf16_steps ? 8e-3 : 1e-4;
        CHECK(sana::test::rel_diff(got.out, ref.out) <= out_tol);
        CHECK(got.dx.scalar_type() == x_dtype);
        CHECK(sana::test::rel_diff(got.dx, ref.dx) <= (x_dtype == at::kBFloat16 ? 8e-3 : grad_tol));
        CHECK(sana::test::rel_diff(got.dtable, ref.dtable) <= grad_tol);
        CHECK(sana::test::rel_diff(got.dt0, ref.dt0) <= grad_tol);
      }
    }
  }
}

TEST_CASE("fused silu -> depthwise 3x3 -> GLU on CUDA: ATen's output and gradients", "[cuda][model][kernels]") {
  if (!torch::cuda::is_available()) FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  torch::manual_seed(12);
  struct Shape {
    int64_t B, h, w, H;
  };
  // Columns and channels that are no multiple of a block's 8 and 32; the 1.6B's 5600.
  for (const Shape s : {Shape{2, 5, 11, 40}, Shape{2, 8, 8, 5600}, Shape{1, 1, 3, 16}}) {
    for (const auto u_dtype : {at::kFloat, at::kBFloat16}) {
      for (const bool autocast : {false, true}) {
        const auto o = torch::TensorOptions().device(torch::kCUDA);
        const int64_t C = 2 * s.H, N = s.h * s.w;
        const auto u = torch::randn({s.B, N, C}, o).to(u_dtype).requires_grad_(true);
        const auto weight = (torch::randn({C, 1, 3, 3}, o) * 0.3).requires_grad_(true);
        const auto bias = (torch::randn({C}, o) * 0.1).requires_grad_(true);
        const auto g = torch::randn({s.B, N, s.H}, o);
        auto run = [&](bool fused) {
          for (auto t : {u, weight, bias}) t.mutable_grad() = torch::Tensor();
          torch::Tensor out;
          {
            AutocastGuard amp(autocast ? autocast_for(torch::Device(torch::kCUDA), at::kBFloat16) : AutocastState{});
            if (fused) {
              REQUIRE(fused_silu_dwconv_glu_applies(u, weight, bias, s.h, s.w));
              out = fused_silu_dwconv_glu(u, weight, bias, s.h, s.w);
            } else {  // GLUMBConv's ATen path (a bf16 input without autocast: a bf16 layer's weights)
              auto t = torch::silu(u).reshape({s.B, s.h, s.w, C}).permute({0, 3, 1, 2});
              const auto dt = autocast ? at::kFloat : u_dtype;
              t = torch::conv2d(t, weight.to(dt), bias.to(dt), 1, 1, 1, C).permute({0, 2, 3, 1}).reshape({s.B, N, C});
              out = t.narrow(2, 0, s.H) * torch::silu(t.narrow(2, s.H, s.H));
            }
          }
          out.backward(g.to(out.scalar_type()));
          return std::vector<torch::Tensor>{out.detach(), u.grad(), weight.grad(), bias.grad()};
        };
        const auto ref = run(false), got = run(true);
        INFO("B " << s.B << " h " << s.h << " w " << s.w << " H " << s.H << " u " << u_dtype << " autocast "
                  << autocast);
        CHECK(got[0].scalar_type() == ref[0].scalar_type());
        CHECK(got[1].scalar_type() == u_dtype);
        CHECK(got[2].scalar_type() == at::kFloat);
        // fp32 throughout: the same sums in another order. A bf16 input or autocast: ATen rounds
        // silu's, the convolution's and the gate's results to bf16 (and their gradients), the
        // kernels only the output and the gradients they return.
        const bool low = u_dtype == at::kBFloat16 || autocast;
        const char* names[] = {"output", "d u", "d weight", "d bias"};
        for (size_t k = 0; k < ref.size(); ++k) {
          INFO(names[k]);
          CHECK(sana::test::rel_diff(got[k], ref[k]) <= (low ? 2e-2 : 1e-4));
        }
      }
    }
  }
}

TEST_CASE("fused linear attention on CUDA: ATen's fp32 output and gradients", "[cuda][model][kernels]") {
  if (!torch::cuda::is_available()) FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  torch::manual_seed(13);
  struct Shape {
    int64_t B, N, H;
  };
  // Tokens that are no multiple of a block's 64 or a reduction block's 512, more than one of
  // those, and the 1.6B's 70 heads.
  for (const Shape s : {Shape{2, 77, 3}, Shape{1, 1100, 2}, Shape{2, 256, 70}}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const auto o = torch::TensorOptions().device(torch::kCUDA);
      // The qkv product's layout, [B, N, 3C] viewed as [B, N, 3, heads, 32].
      const auto qkv = torch::randn({s.B, s.N, 3 * s.H * 32}, o).to(dtype).requires_grad_(true);
      const auto g = torch::randn({s.B, s.N, s.H, 32}, o);
      auto run = [&](bool fused) {
        qkv.mutable_grad() = torch::Tensor();
        const auto q5 = qkv.view({s.B, s.N, 3, s.H, 32});
        const auto out = fused ? fused_linear_attention(q5, LiteLAImpl::kEps)
                             : linear_attention(q5, LiteLAImpl::kEps, /*fp32=*/true);
        out.backward(g);
        return std::make_pair(out.detach(), qkv.grad());
      };
      const auto ref = run(false), got = run(true);
      INFO("B " << s.B << " N " << s.N << " heads " << s.H << " qkv " << dtype);
      CHECK(got.first.scalar_type() == at::kFloat);
      CHECK(got.second.scalar_type() == dtype);
      // The same fp32 sums in another order; a bf16 gradient is that value rounded.
      CHECK(sana::test::rel_diff(got.first, ref.first) <= 1e-4);
      CHECK(sana::test::rel_diff(got.second, ref.second) <= (dtype == at::kBFloat16 ? 8e-3 : 1e-4));
    }
  }
}

TEST_CASE("model.kernels fused on CUDA: the model's loss and gradients are the ATen path's, under bf16 autocast",
          "[cuda][model][kernels]") {
  if (!torch::cuda::is_available()) FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  auto spec = sana::test::small_spec();
  spec.hidden = 256;  // all three kernels apply: 8 heads of 32 channels, a 640-channel GLU
  spec.linear_head_dim = 32;
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  model->to(torch::kCUDA);
  model->set_grad_checkpointing(true);
  model->train();
  torch::manual_seed(4);
  const auto o = torch::TensorOptions().device(torch::kCUDA);
  const auto x = torch::randn({4, spec.in_channels, 16, 16}, o);
  const auto t = torch::rand({4}, o) * 1000;
  Condition cond;
  cond.y = torch::randn({4, spec.caption_tokens, spec.caption_channels}, o);
  cond.mask = torch::ones({4, spec.caption_tokens}, o.dtype(torch::kInt64));
  auto step = [&](bool fused) {
    model->set_fused_kernels(fused);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    torch::Tensor loss;
    {
      AutocastGuard amp(autocast_for(torch::Device(torch::kCUDA), at::kBFloat16));
      loss = model->forward(x, t, cond).to(torch::kFloat).pow(2).mean();
    }
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto aten = step(false);
  const auto fused = step(true);
  CHECK(std::abs(fused.first - aten.first) <= 1e-2 * std::abs(aten.first));
  const auto names = model->named_parameters();
  for (size_t k = 0; k < aten.second.size(); ++k) {
    if (!aten.second[k].defined()) continue;
    INFO(names[k].key());
    REQUIRE(fused.second[k].defined());
    const double norm = aten.second[k].norm().item<double>();
    if (norm == 0) continue;
    CHECK((fused.second[k] - aten.second[k]).norm().item<double>() <= 3e-2 * norm);
  }
}
