// SANA-Sprint's LADD discriminator heads (model/ladd_heads.h) against upstream's DiscHead with
// torch's own spectral norm, in float64 (tests/reference/ladd_heads.py): logits, the hinge
// losses and the power iteration's vectors after two training-mode forwards.
#include "catch.h"
#include <fmt/format.h>
#include <torch/torch.h>

#include "sana/model/ladd_heads.h"
#include "sana/util/safetensors.h"
#include "test_support.h"

using namespace sana::model;

TEST_CASE("SANA-Sprint's discriminator heads: upstream's names, one logit per token", "[model][ladd]") {
  LaddHeads heads(16, 2, 5);
  const auto params = heads->named_parameters();
  const auto buffers = heads->named_buffers();
  CHECK(params.contains("heads.0.main.0.0.weight_orig"));
  CHECK(params["heads.1.main.1.fn.0.weight_orig"].sizes() == torch::IntArrayRef{16, 16, 9});
  CHECK(params["heads.0.main.0.1.weight"].sizes() == torch::IntArrayRef{16});
  CHECK(params["heads.1.cls.weight_orig"].sizes() == torch::IntArrayRef{1, 16, 1});
  CHECK(buffers["heads.0.cls.weight_v"].sizes() == torch::IntArrayRef{16});
  CHECK(buffers["heads.0.main.1.fn.0.weight_u"].norm().item<float>() == Approx(1.0));
  // Initial weights a pure function of the seed.
  LaddHeads again(16, 2, 5), other(16, 2, 6);
  CHECK(torch::equal(again->named_parameters()["heads.1.main.1.fn.0.weight_orig"],
                     params["heads.1.main.1.fn.0.weight_orig"]));
  CHECK_FALSE(torch::equal(other->named_parameters()["heads.1.main.1.fn.0.weight_orig"],
                           params["heads.1.main.1.fn.0.weight_orig"]));
  const auto logits = heads->forward({torch::randn({4, 10, 16}), torch::randn({4, 12, 16})});
  CHECK(logits.sizes() == torch::IntArrayRef{4, 22});
  CHECK_THROWS_WITH(heads->forward({torch::randn({9, 10, 16}), torch::randn({9, 10, 16})}),
                    Catch::Contains("does not split into 2 equal groups"));
}

// Hidden from the default run ([.]); ctest runs it with the other [reference] cases.
TEST_CASE("SANA-Sprint's discriminator heads match upstream's DiscHead with torch's spectral norm",
          "[.reference]") {
  sana::test::TempDir dir;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  LaddHeads heads(24, 3, 11, f64);
  sana::NamedTensors out;
  for (const auto& p : heads->named_parameters()) out.emplace_back("w." + p.key(), p.value().clone());
  for (const auto& b : heads->named_buffers()) out.emplace_back("w." + b.key(), b.value().clone());
  torch::manual_seed(4);
  std::vector<torch::Tensor> real, fake;
  for (int64_t i = 0; i < 3; ++i) {  // 16 samples: two BatchNormLocal groups of 8; 12 tokens
    real.push_back(torch::randn({16, 12, 24}, f64) * 2);
    fake.push_back(torch::randn({16, 12, 24}, f64) + 0.5);
    out.emplace_back(fmt::format("in.real{}", i), real.back());
    out.emplace_back(fmt::format("in.fake{}", i), fake.back());
  }
  heads->train();
  torch::NoGradGuard no_grad;
  const auto d_real = heads->forward(real), d_fake = heads->forward(fake);
  out.emplace_back("out.real", d_real);
  out.emplace_back("out.fake", d_fake);
  out.emplace_back("out.loss_d", hinge_discriminator_loss(d_real, d_fake).reshape({1}));
  out.emplace_back("out.loss_g", hinge_generator_loss(d_fake).reshape({1}));
  for (const auto& b : heads->named_buffers()) out.emplace_back("out.w." + b.key(), b.value());
  const auto file = dir.path("heads.safetensors");
  sana::write_safetensors(file, out, {});
  const std::string script = std::string(SANA_SOURCE_DIR) + "/tests/reference/ladd_heads.py";
  const auto r = sana::test::run_command(SANA_PYTHON " " + script + " " + file);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("3 heads of 24 channels") != std::string::npos);
  WARN(r.output);
  // It notices a wrong logit.
  auto bad = sana::read_safetensors(file);
  for (auto& [name, t] : bad.tensors) {
    if (name == "out.real") t = t * (1 + 1e-7);
  }
  sana::write_safetensors(file, bad.tensors, bad.metadata);
  CHECK(sana::test::run_command(SANA_PYTHON " " + script + " " + file).exit_code == 1);
}
