// Upstream's numerics where they differ on CUDA. Built in every build; ctest runs the [cuda]
// cases as one entry (torch.cuda, tests/unit/cuda_cases.sh), Skipped where no GPU is visible;
// scripts/gpu_check.sh runs them on a GPU machine. Run by hand without a GPU, they fail.
#include "catch.h"

#include <torch/torch.h>

#include <cmath>

#include "sana/model/autocast.h"
#include "sana/model/sana_ms.h"
#include "model_specs.h"

using sana::model::AutocastGuard;
using sana::model::AutocastState;
using sana::model::LiteLAImpl;

TEST_CASE("fp32_attention on CUDA: LiteLA's products stay fp32 under fp16 and bf16 autocast", "[cuda][model]") {
  if (!torch::cuda::is_available()) FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  torch::manual_seed(3);
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  // Magnitudes where fp16 products lose digits (and, larger, overflow into NaN losses).
  const auto q = torch::randn({2, 4, 32, 256}, on_gpu) * 8;
  const auto k = torch::randn({2, 4, 32, 256}, on_gpu) * 8;
  const auto v = torch::randn({2, 4, 32, 256}, on_gpu) * 8;
  const auto reference = LiteLAImpl::attend(q, k, v, LiteLAImpl::kEps, true);  // no autocast
  for (const auto precision : {at::kHalf, at::kBFloat16}) {
    const AutocastState amp_state = sana::model::autocast_for(torch::Device(torch::kCUDA), precision);
    REQUIRE(amp_state.enabled);
    AutocastGuard amp(amp_state);
    // Autocast is on: a plain matmul runs in the lower precision.
    REQUIRE(torch::matmul(q[0][0], k[0][0].t()).scalar_type() == amp_state.dtype);
    const auto under = LiteLAImpl::attend(q, k, v, LiteLAImpl::kEps, true);
    CHECK(under.scalar_type() == torch::kFloat32);
    CHECK(sana::test::rel_diff(under, reference) < 1e-5);
    CHECK(AutocastState::current().enabled);  // back on after the attention
    // Without fp32_attention the products run in half precision: the check above can tell.
    // fp16 overflows at these magnitudes (inf - inf: NaN, as the loss would be), bf16 loses
    // digits: either way not the fp32 result (measured on an H200: NaN under fp16).
    const double half = sana::test::rel_diff(LiteLAImpl::attend(q, k, v, LiteLAImpl::kEps, false), reference);
    CHECK((!std::isfinite(half) || half > 1e-4));
  }
}
