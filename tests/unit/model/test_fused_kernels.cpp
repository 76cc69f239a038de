// model.kernels: fused on the CPU: the fused functions decline CPU tensors, so the model
// runs its ATen path unchanged (the kernels' own tests need a GPU: test_fused_kernels_cuda.cpp).
#include "catch.h"

#include <torch/torch.h>

#include <vector>

#include "sana/model/fused_kernels.h"
#include "sana/model/sana_ms.h"
#include "model_specs.h"

using namespace sana::model;

TEST_CASE("model.kernels fused on the CPU: the ATen path's output and gradients bitwise", "[model][fused]") {
  const auto spec = sana::test::small_spec();
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  model->train();
  torch::manual_seed(8);
  const auto x = torch::randn({2, spec.in_channels, 8, 8});
  const auto t = torch::rand({2}) * 1000;
  Condition cond;
  cond.y = torch::randn({2, spec.caption_tokens, spec.caption_channels});
  auto step = [&](bool fused) {
    model->set_fused_kernels(fused);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    const auto out = model->forward(x, t, cond);
    out.pow(2).mean().backward();
    std::vector<torch::Tensor> grads{out.detach()};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return grads;
  };
  const auto aten = step(false), fused = step(true);
  REQUIRE(aten.size() == fused.size());
  for (size_t k = 0; k < aten.size(); ++k) {
    REQUIRE(aten[k].defined() == fused[k].defined());
    if (aten[k].defined()) CHECK(torch::equal(aten[k], fused[k]));
  }
  const auto mod = torch::zeros({2, 1, spec.hidden});
  const auto tokens = torch::randn({2, 16, spec.hidden});
  CHECK_FALSE(fused_layer_norm_modulate_applies(tokens, mod, mod));
  CHECK_THROWS_WITH(fused_layer_norm_modulate(tokens, mod, mod, 1e-6),
                    Catch::Matchers::Contains("fused_layer_norm_modulate takes CUDA x"));
}
