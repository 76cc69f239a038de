// The reducer's exact mode (train.deterministic) on one process: gradients come back as
// the integer sums of each backward's gradient times 2^scale, the scale follows the
// gradients' size from step to step, and a gradient too large for the sums asks for the
// step's backward again at a smaller scale instead of wrapping around.
#include "catch.h"

#include <torch/torch.h>

#include <cmath>

#include "sana/parallel/reducer.h"
#include "sana/distributed/runtime.h"

using namespace sana;

namespace {

struct OneProcess {
  std::unique_ptr<dist::Runtime> rt = dist::Runtime::start(dist::LaunchEnv{}, dist::RuntimeOptions{}, {"test", "test"});
  torch::Tensor p = torch::zeros({4}, torch::requires_grad());
  std::unique_ptr<parallel::Reducer> reducer =
      parallel::make_reducer(*rt, {{"p", p}}, {25.0, 1.0, true, /*average=*/false, /*exact=*/true});

  // One step of `parts` backwards of loss = sum(p * g); returns the synced gradient.
  torch::Tensor step(const std::vector<torch::Tensor>& parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      reducer->begin_backward(i + 1 == parts.size());
      (p * parts[i]).sum().backward();
    }
    reducer->finalize();
    return reducer->flat_gradients().front().narrow(0, 0, 4).clone();
  }
};

}  // namespace

TEST_CASE("exact reducer: integer sums at an adapting scale, and an overflow asks for the backward again",
          "[reducer][exact]") {
  OneProcess run;
  const auto a = torch::tensor({0.5f, -0.25f, 3.0f, 1e-3f}), b = torch::tensor({0.25f, 0.25f, -1.0f, 2e-3f});
  // Step 1 at the first scale (2^32): the sum of the two, rounded to 2^-32.
  CHECK(run.reducer->exact_scales() == std::vector<int64_t>{32});
  auto g = run.step({a, b});
  CHECK_FALSE(run.reducer->overflowed());
  CHECK(torch::allclose(g, a + b, 0, 1e-9));
  run.reducer->zero_gradients();
  // The next scale puts the summed peak (2.0) just under 2^48: 2^46.
  CHECK(run.reducer->exact_scales() == std::vector<int64_t>{46});
  // A gradient far beyond 2^52 / 2^46: overflow, zero gradients, the scale 12 lower, as
  // often as it takes (2^34 is still too fine for 1e6; 2^22 fits).
  const auto huge = torch::tensor({1e6f, 0.f, 0.f, 0.f});
  for (int64_t scale : {34, 22}) {
    run.step({huge});
    CHECK(run.reducer->overflowed());
    CHECK(run.reducer->flat_gradients().front().abs().max().item<float>() == 0.0f);
    CHECK(run.reducer->exact_scales() == std::vector<int64_t>{scale});
  }
  g = run.step({huge});
  CHECK_FALSE(run.reducer->overflowed());
  CHECK(g[0].item<float>() == 1e6f);
  run.reducer->zero_gradients();
  // A non-finite gradient is not an overflow: it comes back non-finite, for the trainer to skip.
  g = run.step({torch::tensor({NAN, 0.f, 0.f, 0.f})});
  CHECK_FALSE(run.reducer->overflowed());
  CHECK(std::isnan(g[1].item<float>()));
  run.reducer->zero_gradients();
  // The scales survive a checkpoint.
  run.reducer->set_exact_scales({20});
  CHECK(run.reducer->exact_scales() == std::vector<int64_t>{20});
}
