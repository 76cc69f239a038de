// The released encoders' config.json files (tests/configs/released/, as their Hugging Face
// repositories publish them) build, in the native DC-AE and Gemma-2, the networks of the
// published sizes: no weights needed, so the real sizes are checked here, not only the small
// random ones the reference tests load.
//   mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers: its diffusion_pytorch_model.safetensors is
//     listed at 1.25 GB, fp32 (312 M parameters);
//   Efficient-Large-Model/gemma-2-2b-it (Google's gemma-2-2b-it): 2,614,341,888 parameters;
//   google/gemma-2-9b: 9,241,705,984 parameters.
#include "catch.h"

#include <string>

#include "sana/model/dc_ae.h"
#include "sana/model/gemma2.h"
#include "sana/model/hf_weights.h"
#include "test_support.h"

using namespace sana;

namespace {

std::string released(const std::string& repo) { return std::string(SANA_SOURCE_DIR) + "/tests/configs/released/" + repo; }

}  // namespace

TEST_CASE("the released DC-AE config.json builds the published 1.25 GB of fp32 weights", "[model]") {
  const auto folder = released("mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers");
  const auto config = model::DcAeConfig::from_json(model::read_hf_config(folder), folder + "/config.json");
  CHECK(config.downsample() == 32);
  CHECK(config.latent_channels == 32);
  CHECK(config.scaling_factor == 0.41407);
  // The file's listed size, rounded to 3 digits as the hub shows it (the header is a few kB).
  const double gb = static_cast<double>(config.parameters()) * 4 / 1e9;
  INFO(config.parameters() << " parameters, " << gb << " GB in fp32");
  CHECK(gb >= 1.245);
  CHECK(gb < 1.255);
  CHECK(config.elements() == config.parameters());  // no BatchNorm: nothing but parameters
  // efficientvit's layout of the same DC-AE (vae_type dc-ae, mit-han-lab/dc-ae-f32c32-sana-1.1)
  // is the same network, tensor for tensor.
  model::DcAeConfig efficientvit;
  REQUIRE(model::DcAeConfig::for_efficientvit("dc-ae-f32c32-sana-1.1", efficientvit));
  CHECK(model::DcAe::tensor_shapes(efficientvit) == model::DcAe::tensor_shapes(config));
}

TEST_CASE("the released Gemma-2 config.json files build the published parameter counts", "[model]") {
  for (const auto& [repo, published, sliding] :
       {std::tuple<std::string, int64_t, int64_t>{"Efficient-Large-Model--gemma-2-2b-it", 2614341888, 13},
        std::tuple<std::string, int64_t, int64_t>{"google--gemma-2-9b", 9241705984, 21}}) {
    INFO(repo);
    const auto folder = released(repo);
    const auto config = model::Gemma2Config::from_json(model::read_hf_config(folder), folder + "/config.json");
    CHECK(config.parameters() == published);
    CHECK(config.attn_softcap == 50.0);
    CHECK(config.sliding_window == 4096);
    // No layer_types in these files: every even layer slides, as transformers' Gemma2Config.
    int64_t n = 0;
    for (const bool s : config.sliding) n += s ? 1 : 0;
    CHECK(n == sliding);
  }
}
