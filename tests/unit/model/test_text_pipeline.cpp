// Captions as upstream encodes them, around a TorchScript text encoder that takes token ids:
// the SentencePiece tokens (Gemma: BOS first; T5: EOS last; right padding, truncation keeping
// the special tokens), the CHI prompt in front, token 0 and the last L - 1 kept, and the
// empty prompt as the null caption, each against tests/reference/make_text_pipeline.py.
#include "catch.h"
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/config/config.h"
#include "sana/model/encoders.h"
#include "sana/model/sana_ms.h"
#include "sana/model/tokenizer.h"
#include "sana/model/weights.h"
#include "sana/train/input/run_encoders.h"
#include "sana/util/safetensors.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana;

namespace {

const sana::test::TempDir& fixtures() { return sana::test::reference_fixtures("make_text_pipeline.py"); }

nlohmann::json case_json() {
  std::ifstream in(fixtures().path("case.json"));
  return nlohmann::json::parse(in);
}

model::TextEncoderOptions text_config(const std::string& name) {
  const auto c = case_json();
  model::TextEncoderOptions t;
  t.text_encoder_name = name;
  t.text_encoder_path = fixtures().path("ids_encoder.pt");
  t.tokenizer_path = fixtures().path("spm.model");
  t.model_max_length = c.at("model_max_length").get<int64_t>();
  t.caption_channels = 8;
  t.chi_prompt = c.at("chi_prompt").get<std::vector<std::string>>();
  return t;
}

bool same(const torch::Tensor& ours, const torch::Tensor& upstream) {
  return ours.sizes() == upstream.sizes() &&
         torch::allclose(ours.to(torch::kFloat64), upstream.to(torch::kFloat64), 1e-6, 1e-6);
}

}  // namespace

TEST_CASE("captions go through upstream's CHI prompt, tokens and selection", "[model][text]") {
  const auto expected = read_safetensors(fixtures().path("expected.safetensors"));
  const auto captions = case_json().at("captions").get<std::vector<std::string>>();
  auto gemma = model::FrozenTextEncoder::load(text_config("gemma-2-2b-it"), torch::kCPU);
  const auto [features, mask] = gemma.encode(captions);
  CHECK(same(features, expected.get("gemma_features")));
  CHECK(same(mask, expected.get("gemma_mask")));
  // T5: upstream gives it no CHI prompt; EOS ends every caption, even a truncated one.
  auto t5 = model::FrozenTextEncoder::load(text_config("T5"), torch::kCPU);
  const auto [t5_features, t5_mask] = t5.encode(captions);
  CHECK(same(t5_features, expected.get("t5_features")));
  CHECK(same(t5_mask, expected.get("t5_mask")));
  // The null caption: the empty prompt alone (no CHI prompt), as upstream's null embedding.
  CHECK(same(gemma.empty_prompt(), expected.get("null_features")));
  // Without CHI prompt lines every token is kept.
  auto plain_cfg = text_config("gemma-2-2b-it");
  plain_cfg.chi_prompt.clear();
  auto plain = model::FrozenTextEncoder::load(plain_cfg, torch::kCPU);
  CHECK(same(plain.encode({""}).first[0], expected.get("null_features")));
}

TEST_CASE("a caption is encoded once: seen again it comes from the cache, bit for bit, batch or not",
          "[model][text]") {
  const auto captions = case_json().at("captions").get<std::vector<std::string>>();
  REQUIRE(captions.size() >= 2);
  const std::string a = captions[0], b = captions[1];
  auto cached = model::FrozenTextEncoder::load(text_config("gemma-2-2b-it"), torch::kCPU);
  const auto [features, mask] = cached.encode({a, b, a});
  auto stats = cached.cache_stats();
  CHECK(stats.misses == 2);  // the repeat within the batch is not encoded again
  CHECK(stats.hits == 1);
  CHECK(stats.entries == 2);
  CHECK(torch::equal(features[0], features[2]));
  CHECK(torch::equal(mask[0], mask[2]));
  const auto again = cached.encode({b});
  CHECK(cached.cache_stats().hits == 2);
  CHECK(torch::equal(again.first[0], features[1]));
  // The features are the caption's alone: an encoder without a cache gives the same bits for
  // it alone and inside another batch, and upstream's (the reference) within 1e-6.
  auto plain_cfg = text_config("gemma-2-2b-it");
  plain_cfg.caption_cache_bytes = 0;
  auto plain = model::FrozenTextEncoder::load(plain_cfg, torch::kCPU);
  CHECK(torch::equal(plain.encode({b}).first[0], features[1]));
  CHECK(torch::equal(plain.encode({captions.back(), b}).first[1], features[1]));
  CHECK(plain.cache_stats().entries == 0);
  CHECK(plain.cache_stats().misses == 3);
  CHECK_FALSE(plain.cache_stats().full);  // no budget is not a full one
  const auto expected = read_safetensors(fixtures().path("expected.safetensors"));
  CHECK(same(features.narrow(0, 0, 2), expected.get("gemma_features").narrow(0, 0, 2)));
  // A budget of one caption: the second does not fit, is encoded each time, and says so.
  auto probe = model::FrozenTextEncoder::load(text_config("gemma-2-2b-it"), torch::kCPU);
  (void)probe.encode({a});
  auto one_cfg = text_config("gemma-2-2b-it");
  one_cfg.caption_cache_bytes = probe.cache_stats().bytes;  // a's entry, exactly
  auto one = model::FrozenTextEncoder::load(one_cfg, torch::kCPU);
  (void)one.encode({a, b, b});
  stats = one.cache_stats();
  CHECK(stats.entries == 1);
  CHECK(stats.full);
  CHECK(stats.misses == 3);
  CHECK(torch::equal(one.encode({b}).first[0], features[1]));
}

TEST_CASE("token rules: special tokens survive truncation, padding is on the right", "[model][text]") {
  const model::CaptionTokenizer gemma(fixtures().path("spm.model"), "gemma-2-2b-it");
  const model::CaptionTokenizer t5(fixtures().path("spm.model"), "T5");
  const auto long_ids = gemma.encode("a very long caption about a city street at dusk");
  REQUIRE(long_ids.size() > 6);
  CHECK(long_ids.front() == 2);  // BOS
  const auto g = gemma.batch({"a very long caption about a city street at dusk", ""}, 6);
  CHECK(std::vector<int64_t>(g.ids.begin(), g.ids.begin() + 6) == std::vector<int64_t>(long_ids.begin(), long_ids.begin() + 6));
  CHECK(std::vector<int64_t>(g.ids.begin() + 6, g.ids.end()) == std::vector<int64_t>{2, 0, 0, 0, 0, 0});
  CHECK(std::vector<int64_t>(g.mask.begin() + 6, g.mask.end()) == std::vector<int64_t>{1, 0, 0, 0, 0, 0});
  const auto t = t5.batch({"a very long caption about a city street at dusk"}, 6);
  CHECK(t.ids.back() == 1);  // EOS kept
  CHECK(model::select_index(10, 4) == std::vector<int64_t>{0, 7, 8, 9});
  CHECK_THROWS_WITH(model::CaptionTokenizer(fixtures().path("case.json"), "gemma-2-2b-it"),
                    Catch::Contains("text_encoder.tokenizer_path"));
}

TEST_CASE("loading weights makes the empty prompt the null caption, as upstream", "[model][text]") {
  auto spec = sana::test::small_spec(model::Conditioning::caption);
  spec.caption_channels = 8;
  spec.caption_tokens = case_json().at("model_max_length").get<int64_t>();
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, 1});
  train::Encoders encoders;
  encoders.text = std::make_shared<model::FrozenTextEncoder>(
      model::FrozenTextEncoder::load(text_config("gemma-2-2b-it"), torch::kCPU));
  CHECK_FALSE(same(net->caption_embedder->y_embedding, encoders.text->empty_prompt()));
  CHECK(train::use_empty_prompt(net, encoders));
  CHECK(same(net->caption_embedder->y_embedding, encoders.text->empty_prompt()));
  CHECK_FALSE(train::use_empty_prompt(net, train::Encoders{}));
}

TEST_CASE("with precomputed caption features the null caption comes from upstream's null-embedding file",
          "[model]") {
  auto spec = sana::test::small_spec(model::Conditioning::caption);
  spec.caption_channels = 8;
  spec.caption_tokens = 6;
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, 1});
  sana::test::TempDir dir;
  // As upstream's train.py writes output/pretrained_models/null_embed_diffusers_<N>token.pth.
  const std::string pth = dir.path("null_embed_diffusers_6token.pth");
  const auto made = sana::test::run_command(
      SANA_PYTHON " -c \"import torch; g = torch.Generator().manual_seed(4); "
      "torch.save({'uncond_prompt_embeds': torch.randn(1, 6, 8, generator=g), "
      "'uncond_prompt_embeds_mask': torch.ones(1, 6, dtype=torch.long)}, '" + pth + "')\"");
  REQUIRE(made.exit_code == 0);
  const auto expected = model::read_state_dict(pth).at("uncond_prompt_embeds")[0];
  CHECK_FALSE(same(net->caption_embedder->y_embedding, expected));
  CHECK(train::use_empty_prompt(net, train::Encoders{}, pth));
  CHECK(same(net->caption_embedder->y_embedding, expected));
  // A file for another length or width says which keys disagree.
  write_safetensors(dir.path("wide.safetensors"), {{"uncond_prompt_embeds", torch::zeros({1, 6, 16})}});
  CHECK_THROWS_WITH(train::use_empty_prompt(net, train::Encoders{}, dir.path("wide.safetensors")),
                    Catch::Contains("caption_channels"));
  write_safetensors(dir.path("other.safetensors"), {{"y", torch::zeros({6, 8})}});
  CHECK_THROWS_WITH(train::use_empty_prompt(net, train::Encoders{}, dir.path("other.safetensors")),
                    Catch::Contains("uncond_prompt_embeds"));
  // Unset, the key means the file upstream's train.py writes, under train.null_embed_root.
  config::Config cfg;
  cfg.text_encoder.text_encoder_name = "gemma-2-2b-it";
  cfg.text_encoder.model_max_length = 6;
  cfg.text_encoder.caption_channels = 8;
  cfg.train.null_embed_root = dir.path("none");
  CHECK(config::null_embed_file(cfg).empty());
  cfg.train.null_embed_root = dir.path();
  CHECK(config::null_embed_file(cfg) == pth);  // the older name
  const std::string current = dir.path("null_embed_diffusers_gemma-2-2b-it_6token_8.pth");
  std::filesystem::copy_file(pth, current);
  CHECK(config::null_embed_file(cfg) == current);
  cfg.text_encoder.null_embed_path = pth;
  CHECK(config::null_embed_file(cfg) == pth);
}
