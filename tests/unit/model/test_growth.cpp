// SANA-1.5's model growth (model/growth.h): a 6-block model from a 2-block checkpoint by
// each of upstream's six strategies (cyclic and block_expand with and without zero_gate),
// compared tensor for tensor with tests/reference/model_growth.py (upstream's rules in
// python3-torch); and the checkpoints and settings that cannot grow, refused by key.
#include "catch.h"
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "sana/model/growth.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/safetensors.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana;
using namespace sana::model;

namespace {

ModelSpec spec_of_depth(int64_t depth) {
  ModelSpec s = test::small_spec();
  s.depth = depth;
  s.qk_norm = s.cross_norm = true;  // SANA-1.5's blocks: the q/k norms have rules of their own
  return s;
}

// A 2-block model whose every tensor is nonzero and distinct (zero-initialised gates and
// projections would hide what a strategy copies).
std::string write_source(const test::TempDir& dir) {
  SanaMS source(spec_of_depth(2), BuildOptions{torch::kFloat32, false, 3});
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(11);
  for (auto& [name, t] : module_tensors(*source)) t.add_(torch::randn(t.sizes(), gen, t.options()) * 0.1);
  const std::string path = dir.path("source.safetensors");
  save_weights(*source, path);
  return path;
}

GrowthOptions options(const std::string& source, GrowthStrategy strategy, bool zero_gate = false) {
  GrowthOptions o;
  o.source = source;
  o.strategy = strategy;
  o.source_layers = 2;
  o.target_layers = 6;
  o.zero_gate = zero_gate;
  o.noise_scale = 0.05;
  o.scale_spec = 0.01;
  o.seed = 5;
  return o;
}

}  // namespace

TEST_CASE("model growth initialises every tensor by upstream's rules (model_growth.py)", "[model][reference]") {
  test::TempDir dir;
  const std::string source = write_source(dir);
  const std::vector<std::pair<std::string, GrowthOptions>> cases = {
      {"cyclic", options(source, GrowthStrategy::cyclic)},
      {"cyclic", options(source, GrowthStrategy::cyclic, true)},
      {"block_expand", options(source, GrowthStrategy::block_expand)},
      {"block_expand", options(source, GrowthStrategy::block_expand, true)},
      {"progressive", options(source, GrowthStrategy::progressive)},
      {"interpolation", options(source, GrowthStrategy::interpolation)},
      {"random", options(source, GrowthStrategy::random)},
      {"constant", options(source, GrowthStrategy::constant)},
  };
  std::vector<std::string> files;
  for (const auto& [name, o] : cases) {
    SanaMS target(spec_of_depth(6), BuildOptions{torch::kFloat32, false, 7});
    NamedTensors out;
    nlohmann::json order = nlohmann::json::array();
    for (const auto& [key, t] : module_tensors(*target)) {
      out.emplace_back("init." + key, t.clone());
      order.push_back(key);
    }
    const auto report = grow_model(*target, o);
    CHECK(report.source_blocks == 2);
    for (const auto& [key, t] : module_tensors(*target)) out.emplace_back("out." + key, t.clone());
    const nlohmann::json params = {{"expand_ratio", o.expand_ratio}, {"noise_scale", o.noise_scale},
                                   {"zero_gate", o.zero_gate},       {"scale_spec", o.scale_spec},
                                   {"scale_others", o.scale_others}};
    files.push_back(dir.path(fmt::format("case{}.safetensors", files.size())));
    write_safetensors(files.back(), out,
                      {{"case", name + (o.zero_gate ? " with zero_gate" : "")}, {"strategy", name},
                       {"params", params.dump()}, {"source_layers", "2"}, {"target_layers", "6"},
                       {"seed", std::to_string(o.seed)}, {"order", order.dump()}});
  }
  const std::string script = std::string(SANA_SOURCE_DIR) + "/tests/reference/model_growth.py";
  const auto r = test::run_command(fmt::format(SANA_PYTHON " {} {} {}", script, source, fmt::join(files, " ")));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("every tensor equal") != std::string::npos);
  WARN(r.output);

  // The reference notices a tensor grown otherwise: one value of one new block changed.
  auto file = read_safetensors(files[4]);  // progressive
  for (auto& [name, t] : file.tensors) {
    if (name == "out.blocks.3.attn.qkv.weight") {
      t = t.clone();
      t[0][0] += 1e-3;
    }
  }
  write_safetensors(files[4], file.tensors, file.metadata);
  CHECK(test::run_command(fmt::format(SANA_PYTHON " {} {} {}", script, source, files[4])).exit_code == 1);
}

TEST_CASE("model growth refuses what cannot grow, naming the key", "[model]") {
  test::TempDir dir;
  const std::string source = write_source(dir);
  SanaMS target(spec_of_depth(6), BuildOptions{torch::kFloat32, false, 7});
  auto o = options(source, GrowthStrategy::cyclic);
  o.target_layers = 5;
  CHECK_THROWS_WITH(grow_model(*target, o), Catch::Contains("model_growth.target_num_layers: 5, but model.model has 6"));
  o = options(source, GrowthStrategy::cyclic);
  o.source_layers = 3;
  CHECK_THROWS_WITH(grow_model(*target, o), Catch::Contains("model_growth.source_num_layers: 3, but"));
  o = options(source, GrowthStrategy::block_expand);
  o.expand_ratio = 2;
  CHECK_THROWS_WITH(grow_model(*target, o), Catch::Contains("model_growth.init_params.expand_ratio"));
  // A checkpoint of another family: its extra tensors have no place in the model.
  SanaMS plain_target(test::small_spec(), BuildOptions{torch::kFloat32, false, 7});  // no q/k norms
  auto plain = options(source, GrowthStrategy::random);
  plain.target_layers = 2;
  CHECK_THROWS_WITH(grow_model(*plain_target, plain), Catch::Contains("which model.model has no place for"));
  // Fewer source blocks than the checkpoint has: only the first ones are used.
  auto first = options(source, GrowthStrategy::cyclic);
  first.source_layers = 1;
  SanaMS grown(spec_of_depth(6), BuildOptions{torch::kFloat32, false, 7});
  grow_model(*grown, first);
  const auto weights = read_state_dict(source);
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < 6; ++i) {
    CHECK(torch::equal(grown->named_parameters()[fmt::format("blocks.{}.attn.qkv.weight", i)],
                       weights.at("blocks.0.attn.qkv.weight")));
  }
}
