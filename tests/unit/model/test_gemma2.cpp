// The native Gemma-2 against transformers' own (tests/reference/make_gemma2.py): a small random
// Gemma2ForCausalLM saved in shards by save_pretrained, its decoder's last hidden state for a
// right-padded batch in fp32 and bf16, the errors a folder that is not one gets, the token ids
// of 1000 captions against transformers' GemmaTokenizer, and upstream train.py's caption
// features through the folder.
#include "catch.h"
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/model/encoders.h"
#include "sana/model/gemma2.h"
#include "sana/model/tokenizer.h"
#include "sana/model/weights.h"
#include "sana/util/safetensors.h"
#include "test_support.h"

using namespace sana;

namespace {

const sana::test::TempDir& gemma_fixtures() { return sana::test::reference_fixtures("make_gemma2.py"); }

// The largest difference over the largest value, on the positions that are tokens.
double relative_error(const torch::Tensor& ours, const torch::Tensor& theirs, const torch::Tensor& mask) {
  const auto keep = mask.to(torch::kBool).unsqueeze(-1);
  const auto diff = (ours.to(torch::kFloat64) - theirs.to(torch::kFloat64)).abs().masked_fill(~keep, 0);
  return diff.max().item<double>() / theirs.to(torch::kFloat64).abs().max().item<double>();
}

void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

}  // namespace

TEST_CASE("the native Gemma-2 computes transformers' last hidden state from its sharded folder",
          "[model][reference]") {
  const auto expected = read_safetensors(gemma_fixtures().path("expected.safetensors"));
  const auto& ids = expected.get("ids");
  const auto& mask = expected.get("mask");
  const auto folder = gemma_fixtures().path("gemma");

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
  fs::copy(gemma_fixtures().path("gemma"), folder);

  SECTION("a missing shard") {
    const auto index = sana::test::read_json_file(folder + "/model.safetensors.index.json");
    const std::string shard = index.at("weight_map").begin().value();
    fs::remove(folder + "/" + shard);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains(shard));
  }
  SECTION("a config with more layers than the weights") {
    auto config = sana::test::read_json_file(folder + "/config.json");
    config["num_hidden_layers"] = 4;
    config["layer_types"].push_back("full_attention");
    write_json(folder + "/config.json", config);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("layers.3.self_attn.q_proj.weight missing"));
  }
  SECTION("another hidden size") {
    auto config = sana::test::read_json_file(folder + "/config.json");
    config["intermediate_size"] = 64;
    write_json(folder + "/config.json", config);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("mlp.gate_proj.weight is [48, 32], the config makes it [64, 32]"));
  }
  SECTION("another model type") {
    auto config = sana::test::read_json_file(folder + "/config.json");
    config["model_type"] = "t5";
    config["architectures"] = {"T5EncoderModel"};
    write_json(folder + "/config.json", config);
    CHECK_THROWS_AS(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32), model::WeightsError);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains("not gemma2"));
  }
  SECTION("bidirectional attention, which the encoder built in does not compute") {
    auto config = sana::test::read_json_file(folder + "/config.json");
    config["use_bidirectional_attention"] = true;
    write_json(folder + "/config.json", config);
    CHECK_THROWS_WITH(model::Gemma2::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("use_bidirectional_attention"));
  }
}

TEST_CASE("Gemma-2's tokenizer.model tokenizes 1000 captions as transformers' GemmaTokenizer", "[model][reference]") {
  const auto tokens = sana::test::read_json_file(gemma_fixtures().path("tokens.json"));
  const model::CaptionTokenizer tokenizer(gemma_fixtures().path("gemma/tokenizer.model"), "gemma-2-2b-it");
  const auto& captions = tokens.at("captions");
  const auto& ids = tokens.at("ids");
  REQUIRE(captions.size() == 1000);
  size_t same = 0, empty = 0, longest = 0;
  std::string first_difference;
  for (size_t i = 0; i < captions.size(); ++i) {
    const auto ours = tokenizer.encode(captions[i].get<std::string>());
    const auto theirs = ids[i].get<std::vector<int64_t>>();
    if (ours == theirs) {
      ++same;
    } else if (first_difference.empty()) {
      first_difference = captions[i].dump();
    }
    empty += captions[i].get<std::string>().empty() ? 1 : 0;
    longest = std::max(longest, theirs.size());
  }
  INFO("first caption tokenized otherwise: " << first_difference);
  CHECK(same == captions.size());
  CHECK(empty == 10);
  CHECK(longest > 300);  // long captions are in the set
  // A batch at max_length 16: BOS first, truncated at the end, padded on the right.
  std::vector<std::string> first;
  for (size_t i = 0; i < 40; ++i) first.push_back(captions[i].get<std::string>());
  const int64_t length = tokens.at("batch_length").get<int64_t>();
  const auto batch = tokenizer.batch(first, length);
  std::vector<int64_t> want_ids, want_mask;
  for (const auto& row : tokens.at("batch_ids")) {
    for (const auto& v : row) want_ids.push_back(v.get<int64_t>());
  }
  for (const auto& row : tokens.at("batch_mask")) {
    for (const auto& v : row) want_mask.push_back(v.get<int64_t>());
  }
  CHECK(batch.ids == want_ids);
  CHECK(batch.mask == want_mask);
}

TEST_CASE("captions through a Gemma-2 folder get upstream train.py's features, as transformers computes them",
          "[model][reference]") {
  const auto pipeline = sana::test::read_json_file(gemma_fixtures().path("pipeline.json"));
  const auto expected = read_safetensors(gemma_fixtures().path("pipeline.safetensors"));
  model::TextEncoderOptions options;
  options.text_encoder_name = "gemma-2-2b-it";
  options.text_encoder_path = gemma_fixtures().path("gemma");
  options.gemma2_folder = true;
  options.tokenizer_path = gemma_fixtures().path("gemma/tokenizer.model");
  options.caption_channels = 32;
  options.model_max_length = pipeline.at("model_max_length").get<int64_t>();
  options.chi_prompt = pipeline.at("chi_prompt").get<std::vector<std::string>>();
  auto encoder = model::FrozenTextEncoder::load(options, torch::kCPU);
  const auto [features, mask] = encoder.encode(pipeline.at("prompts").get<std::vector<std::string>>());
  REQUIRE(features.sizes() == expected.get("features").sizes());
  CHECK(torch::equal(mask, expected.get("mask").to(torch::kInt64)));
  CHECK(relative_error(features, expected.get("features"), torch::ones_like(mask)) < 1e-5);
  // The null caption: the empty prompt at model_max_length, no CHI prompt, every position.
  const auto null = encoder.empty_prompt();
  CHECK(relative_error(null.unsqueeze(0), expected.get("null_features").unsqueeze(0),
                       torch::ones({1, null.size(0)}, torch::kInt64)) < 1e-5);
  // A width other than the folder's is the config's mistake, named.
  options.caption_channels = 2304;
  CHECK_THROWS_WITH(model::FrozenTextEncoder::load(options, torch::kCPU),
                    Catch::Contains("text_encoder.caption_channels 2304"));
}
