// The native DC-AE against diffusers' AutoencoderDC (tests/reference/make_dc_ae.py): three small
// random configurations (Sana's, the in/mix family's, DC-AE-Lite's) that hold every block type
// and option of the released ones, saved by
// save_pretrained (one in shards), encoded and decoded by diffusers in fp32 and bf16; and the
// errors a folder that is not one gets.
#include "catch.h"
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/model/dc_ae.h"
#include "sana/model/weights.h"
#include "sana/util/safetensors.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana;

namespace {

const sana::test::TempDir& dc_ae_fixtures() { return sana::test::reference_fixtures("make_dc_ae.py"); }

}  // namespace

TEST_CASE("the native DC-AE encodes and decodes as diffusers' AutoencoderDC", "[model][reference]") {
  const auto cases = sana::test::read_json_file(dc_ae_fixtures().path("cases.json"));
  for (const std::string name : {"sana", "in", "lite"}) {
    INFO("configuration " << name);
    const auto expected = read_safetensors(dc_ae_fixtures().path(name + ".safetensors"));
    const auto vae = model::DcAe::load(dc_ae_fixtures().path(name), torch::kCPU, torch::kFloat32);
    CHECK(vae.parameters() == cases.at(name).at("parameters").get<int64_t>());
    CHECK(vae.config().scaling_factor == cases.at(name).at("scaling_factor").get<double>());
    CHECK(vae.config().downsample() == 4);
    const auto z = vae.encode(expected.get("images"));
    REQUIRE(z.sizes() == expected.get("latents_fp32").sizes());
    CHECK(sana::test::rel_diff(z, expected.get("latents_fp32")) < 1e-5);
    const auto x = vae.decode(expected.get("latents_fp32"));
    REQUIRE(x.sizes() == expected.get("decoded_fp32").sizes());
    CHECK(sana::test::rel_diff(x, expected.get("decoded_fp32")) < 1e-5);
    // 8 x 8 images: the last stage is 2 x 2, where diffusers' attention is quadratic.
    CHECK(sana::test::rel_diff(vae.encode(expected.get("small")), expected.get("small_latents")) < 1e-5);
    CHECK(sana::test::rel_diff(vae.decode(expected.get("small_latents")), expected.get("small_decoded")) < 1e-5);
  }
  // bf16, as upstream runs it on a GPU: the same casts (fp32 sums in the attention and the norms).
  const auto expected = read_safetensors(dc_ae_fixtures().path("sana.safetensors"));
  const auto bf16 = model::DcAe::load(dc_ae_fixtures().path("sana"), torch::kCPU, torch::kBFloat16);
  const auto z = bf16.encode(expected.get("images").to(torch::kBFloat16));
  CHECK(z.scalar_type() == torch::kBFloat16);
  const double err = sana::test::rel_diff(z, expected.get("latents_bf16"));
  CHECK(err < 2e-2);
  CHECK(sana::test::rel_diff(z, expected.get("latents_fp32")) > err);  // the bf16 check can fail
  CHECK(sana::test::rel_diff(bf16.decode(expected.get("latents_bf16")), expected.get("decoded_bf16")) < 2e-2);
}

TEST_CASE("an AutoencoderDC folder that does not match its config is refused, naming what is wrong",
          "[model][reference]") {
  namespace fs = std::filesystem;
  sana::test::TempDir dir;
  const auto folder = dir.path("vae");
  fs::copy(dc_ae_fixtures().path("sana"), folder);
  const auto write = [&](const nlohmann::json& j) { std::ofstream(folder + "/config.json") << j.dump(2); };
  auto config = sana::test::read_json_file(folder + "/config.json");
  SECTION("a missing shard") {
    const auto index = sana::test::read_json_file(folder + "/diffusion_pytorch_model.safetensors.index.json");
    const std::string shard = index.at("weight_map").begin().value();
    fs::remove(folder + "/" + shard);
    CHECK_THROWS_WITH(model::DcAe::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains(shard));
  }
  SECTION("one layer more than the weights") {
    config["encoder_layers_per_block"] = {1, 1, 3};
    write(config);
    CHECK_THROWS_WITH(model::DcAe::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("encoder.down_blocks.2.2.attn.to_q.weight missing"));
  }
  SECTION("pixel-unshuffle down samplers where the weights are stride-2 convolutions") {
    config["downsample_block_type"] = "pixel_unshuffle";
    write(config);
    CHECK_THROWS_WITH(model::DcAe::load(folder, torch::kCPU, torch::kFloat32),
                      Catch::Contains("encoder.down_blocks.0.1.conv.weight is [16, 8, 3, 3], the config makes it "
                                      "[4, 8, 3, 3]"));
  }
  SECTION("a block type the built-in DC-AE lacks") {
    config["decoder_block_types"] = {"ResBlock", "ResBlock", "SwinBlock"};
    write(config);
    CHECK_THROWS_WITH(model::DcAe::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains("SwinBlock"));
  }
  SECTION("another class") {
    config["_class_name"] = "AutoencoderKL";
    write(config);
    CHECK_THROWS_AS(model::DcAe::load(folder, torch::kCPU, torch::kFloat32), model::WeightsError);
    CHECK_THROWS_WITH(model::DcAe::load(folder, torch::kCPU, torch::kFloat32), Catch::Contains("not AutoencoderDC"));
  }
}

TEST_CASE("efficientvit's layout of the same DC-AE loads to diffusers' outputs", "[model][reference]") {
  // make_dc_ae.py wrote "sana"'s weights under efficientvit's names, names diffusers' own
  // converter turns back into exactly "sana"'s state dict.
  const auto expected = read_safetensors(dc_ae_fixtures().path("sana.safetensors"));
  const auto config = model::DcAeConfig::from_json(sana::test::read_json_file(dc_ae_fixtures().path("sana/config.json")),
                                                   "sana/config.json");
  const auto folder = dc_ae_fixtures().path("sana_efficientvit");
  const auto vae = model::DcAe::load_efficientvit(folder, config, torch::kCPU, torch::kFloat32);
  CHECK(sana::test::rel_diff(vae.encode(expected.get("images")), expected.get("latents_fp32")) < 1e-5);
  CHECK(sana::test::rel_diff(vae.decode(expected.get("latents_fp32")), expected.get("decoded_fp32")) < 1e-5);
  // By name: Sana's DC-AE 1.0 and 1.1 are read (these small weights are not its sizes: named
  // as a strict load names them); the lite one is refused, naming its diffusers repo.
  CHECK_THROWS_WITH(model::DcAe::load_efficientvit(folder, "dc-ae-f32c32-sana-1.1", torch::kCPU, torch::kFloat32),
                    Catch::Contains("encoder.conv_in.weight is [8, 3, 3, 3], the config makes it [128, 3, 3, 3]"));
  CHECK_THROWS_WITH(model::DcAe::load_efficientvit(folder, "dc-ae-lite-f32c32-sana-1.1", torch::kCPU, torch::kFloat32),
                    Catch::Contains("dc-ae-lite-f32c32-sana-1.1-diffusers"));
}
