// The native Gemma-2 against transformers' own: a small random Gemma2ForCausalLM saved in
// shards by save_pretrained, its decoder's last hidden state for a right-padded batch in fp32
// and bf16 (tests/reference/make_gemma2.py), and the errors a folder that is not one gets.
#include "catch.h"
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/model/gemma2.h"
#include "sana/model/weights.h"
#include "sana/util/safetensors.h"
#include "test_support.h"

using namespace sana;

namespace {

const sana::test::TempDir& fixtures() { return sana::test::reference_fixtures("make_gemma2.py"); }

// The largest difference over the largest value, on the positions that are tokens.
double relative_error(const torch::Tensor& ours, const torch::Tensor& theirs, const torch::Tensor& mask) {
  const auto keep = mask.to(torch::kBool).unsqueeze(-1);
  const auto diff = (ours.to(torch::kFloat64) - theirs.to(torch::kFloat64)).abs().masked_fill(~keep, 0);
  return diff.max().item<double>() / theirs.to(torch::kFloat64).abs().max().item<double>();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

}  // namespace

TEST_CASE("the native Gemma-2 computes transformers' last hidden state from its sharded folder",
          "[model][reference]") {
  const auto expected = read_safetensors(fixtures().path("expected.safetensors"));
  const auto& ids = expected.get("ids");
  const auto& mask = expected.get("mask");
  const auto folder = fixtures().path("gemma");

  const auto fp32 = model::Gemma2::load(folder, torch::kCPU, torch::kFloat32);
  CHECK(fp32.config().layers == 3);
  CHECK(fp32.config().sliding == std::vector<bool>{true, false, true});
  CHECK(fp32.bytes() == fp32.config().parameters() * 4);
  const auto hidden = fp32.forward(ids, mask);
  REQUIRE(hidden.sizes() == expected.get("hidden_fp32").sizes());
  CHECK(relative_error(hidden, expected.get("hidden_fp32"), mask) < 1e-5);
  // The padding too: its rows see the tokens before them (and where a sliding window holds
  // only padding, every key evenly), as transformers' eager attention computes them.
  CHECK(relative_error(hidden, expected.get("hidden_fp32"), torch::ones_like(mask)) < 1e-5);

  // bf16, as upstream runs it: the same casts in the same places (embedding scale, fp32
  // norms and softmax), so within a few bf16 roundings.
  const auto bf16 = model::Gemma2::load(folder, torch::kCPU, torch::kBFloat16);
  CHECK(bf16.bytes() == fp32.bytes() / 2);
  const auto hidden_bf16 = bf16.forward(ids, mask);
  CHECK(hidden_bf16.scalar_type() == torch::kBFloat16);
  CHECK(relative_error(hidden_bf16, expected.get("hidden_bf16"), mask) < 2e-2);
  // And both dtypes' answers differ by more than that between them (the bf16 check can fail).
  CHECK(relative_error(hidden_bf16, expected.get("hidden_fp32"), mask) >
        relative_error(hidden_bf16, expected.get("hidden_bf16"), mask));
}

TEST_CASE("a Gemma-2 folder that does not match its config is refused, naming what is wrong", "[model][reference]") {
  namespace fs = std::filesystem;
  sana::test::TempDir dir;
  const auto folder = dir.path("gemma");
  fs::copy(fixtures().path("gemma"), folder);

  SECTION("a missing shard") {
    const auto index = read_json(folder + "/model.safetensors.index.json");
    const std::string shard = index.at("weight_map").begin().value();
    fs::remove(folder + "/" + shard);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains(shard));
  }
  SECTION("a config with more layers than the weights") {
    auto config = read_json(folder + "/config.json");
    config["num_hidden_layers"] = 4;
    config["layer_types"].push_back("full_attention");
    write_json(folder + "/config.json", config);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("layers.3.self_attn.q_proj.weight missing"));
  }
  SECTION("another hidden size") {
    auto config = read_json(folder + "/config.json");
    config["intermediate_size"] = 64;
    write_json(folder + "/config.json", config);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("mlp.gate_proj.weight is [48, 32], the config makes it [64, 32]"));
  }
  SECTION("another model type") {
    auto config = read_json(folder + "/config.json");
    config["model_type"] = "t5";
    config["architectures"] = {"T5EncoderModel"};
    write_json(folder + "/config.json", config);
    CHECK_THROWS_AS(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32), model::WeightsError);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains("not gemma2"));
  }
  SECTION("bidirectional attention, which the encoder built in does not compute") {
    auto config = read_json(folder + "/config.json");
    config["use_bidirectional_attention"] = true;
    write_json(folder + "/config.json", config);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("use_bidirectional_attention"));
  }
}
