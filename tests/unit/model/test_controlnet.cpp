// ControlNet on SanaMS (upstream's SanaMSControlNet): the control blocks start as copies of
// the base's first blocks with zero projections, so the model is the base exactly; the
// parameter names are upstream's, checked both ways against upstream's modules in
// python3-torch (tests/reference/upstream_model.py), and the forward equals theirs; and
// diffusers itself loads our ControlNet export and computes our forward.
#include "catch.h"
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "sana/diffusion/flow_matching.h"
#include "sana/model/controlnet.h"
#include "sana/model/export.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/train/options/core_options.h"
#include "sana/util/safetensors.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana::model;

namespace {

ModelSpec control_spec(int64_t blocks = 2) {
  auto s = sana::test::small_spec();
  s.depth = 4;
  s.control_blocks = blocks;
  return s;
}

struct Batch {
  torch::Tensor x, t;
  Condition c;
};

Batch batch_for(const ModelSpec& s, torch::Dtype dtype) {
  torch::manual_seed(4);
  const int64_t B = 2;
  const auto x0 = torch::randn({B, s.in_channels, 8, 16});
  const auto flow = sana::diffusion::make_flow_batch(x0, {31, 32}, 5, 0, sana::diffusion::TimestepOptions{});
  Batch b{flow.noisy.to(dtype), flow.timesteps.to(dtype), {}};
  b.c.y = torch::randn({B, s.caption_tokens, s.caption_channels}, dtype);
  b.c.mask = torch::ones({B, s.caption_tokens}, torch::kInt64);
  b.c.mask.index_put_({0, torch::indexing::Slice(s.caption_tokens - 2)}, 0);
  b.c.drop = torch::tensor({false, true});
  b.c.control = torch::randn({B, s.in_channels, 8, 16}, dtype);
  return b;
}

}  // namespace

TEST_CASE("a ControlNet model starts as its base model exactly, with upstream's names", "[model][controlnet]") {
  auto base_spec = control_spec();
  base_spec.control_blocks = 0;
  SanaMS base(base_spec, BuildOptions{torch::kFloat32, false, 5});
  SanaMS ctl(control_spec(), BuildOptions{torch::kFloat32, false, 5});
  const auto ctl_params = ctl->named_parameters();
  for (const auto& p : base->named_parameters()) {
    INFO(p.key());
    CHECK(torch::equal(p.value(), ctl_params[p.key()]));  // the same base from the same seed
  }
  for (const char* name : {"controlnet.0.copied_block.attn.qkv.weight", "controlnet.0.before_proj.weight",
                           "controlnet.0.after_proj.bias", "controlnet.1.copied_block.mlp.point_conv.conv.weight",
                           "controlnet.1.after_proj.weight"}) {
    INFO(name);
    CHECK(ctl_params.contains(name));
  }
  CHECK_FALSE(ctl_params.contains("controlnet.1.before_proj.weight"));  // the first block's alone
  CHECK(torch::equal(ctl_params["controlnet.1.copied_block.attn.qkv.weight"], ctl_params["blocks.1.attn.qkv.weight"]));
  CHECK(ctl_params["controlnet.1.after_proj.weight"].abs().sum().item<double>() == 0);

  torch::NoGradGuard no_grad;
  const auto b = batch_for(control_spec(), torch::kFloat32);
  const auto plain = base->forward(b.x, b.t, b.c);
  CHECK(torch::equal(ctl->forward(b.x, b.t, b.c), plain));  // zero projections: the base's output, bit for bit
  auto without = b.c;
  without.control = torch::Tensor();
  CHECK(torch::equal(ctl->forward(b.x, b.t, without), plain));
  {
    FlopTrace trace;  // MFU's count has the copied blocks, the control's embedding and the projections
    ctl->forward(b.x, b.t, b.c);
    CHECK(trace.flops() == Approx(2 * forward_flops(control_spec(), 8, 16).total).epsilon(1e-12));
  }
  // Trained projections: the control moves the output, control_scale 0 takes it away.
  for (auto& p : ctl->named_parameters()) {
    if (p.key().find("before_proj.") != std::string::npos || p.key().find("after_proj.") != std::string::npos) {
      p.value().normal_(0, 0.05);
    }
  }
  CHECK_FALSE(torch::equal(ctl->forward(b.x, b.t, b.c), plain));
  auto off = b.c;
  off.control_scale = 0;
  CHECK(torch::allclose(ctl->forward(b.x, b.t, off), plain, 0, 0));
}

TEST_CASE("every ControlNet preset has upstream's copy_blocks_num and builds", "[model][controlnet]") {
  for (const auto& [name, base, copies] : {std::tuple{"SanaMSControlNet_600M_P1_D28", "SanaMS_600M_P1_D28", 7},
                                           std::tuple{"SanaMSControlNet_1600M_P1_D20", "SanaMS_1600M_P1_D20", 7},
                                           std::tuple{"SanaMSControlNet_tiny_P2_D4", "SanaMS_tiny_P2_D4", 2}}) {
    INFO(name);
    const auto spec = preset_spec(name), plain = preset_spec(base);
    CHECK(spec.control_blocks == copies);
    SanaMS with(spec, BuildOptions{torch::kFloat32, true, 0}), without(plain, BuildOptions{torch::kFloat32, true, 0});
    const int64_t C = spec.hidden;
    int64_t block = 0;
    for (const auto& p : without->blocks[0]->parameters()) block += p.numel();
    // The copies, before_proj once and after_proj per copy (C x C + C each).
    CHECK(with->parameter_count() == without->parameter_count() + copies * (block + C * C + C) + C * C + C);
  }
}

TEST_CASE("the ControlNet presets have the parameter counts of upstream's SanaMSControlNet", "[model][reference]") {
  // tests/reference/upstream_model.py --count-control builds upstream's SanaMSControlNet
  // (modules shaped as sana_multi_scale_controlnet.py's) and counts its parameters.
  const std::string script = std::string(SANA_SOURCE_DIR) + "/tests/reference/upstream_model.py";
  for (const char* name : {"SanaMSControlNet_600M_P1_D28", "SanaMSControlNet_1600M_P1_D20"}) {
    INFO(name);
    sana::config::Config cfg;  // upstream's YAMLs: 32 latent channels, gemma's 2304 x 300 captions
    cfg.model.model = name;
    cfg.data.load_vae_feat = cfg.data.load_text_feat = true;
    const auto spec = sana::train::model_spec_for(cfg);
    SanaMS model(spec, BuildOptions{torch::kFloat32, true, 0});
    const auto r = sana::test::run_command(fmt::format(SANA_PYTHON " {} --count-control {} {} {} {}", script,
                                                       spec.hidden, spec.cross_heads, spec.depth, spec.control_blocks));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(std::stoll(r.output) == model->parameter_count());
  }
}

// Hidden from the default run ([.]); ctest runs it as part of "reference.model".
TEST_CASE("the ControlNet forward equals upstream's SanaMSControlNet, and the names load both ways", "[.reference]") {
  sana::test::TempDir dir;
  const auto spec = control_spec(3);
  SanaMS model(spec, BuildOptions{torch::kFloat64, false, 21});
  {
    torch::NoGradGuard no_grad;
    auto gen = at::detail::createCPUGenerator(22);
    for (auto& p : model->parameters()) p.add_(torch::empty(p.sizes(), p.options()).normal_(0, 0.05, gen));
  }
  const auto b = batch_for(spec, torch::kFloat64);
  torch::Tensor pred;
  {
    torch::NoGradGuard no_grad;
    pred = model->forward(b.x, b.t, b.c);
  }
  sana::NamedTensors out;
  for (const auto& p : model->named_parameters()) out.emplace_back("w." + p.key(), p.value());
  for (const auto& p : model->named_buffers()) out.emplace_back("w." + p.key(), p.value());
  out.emplace_back("in.x", b.x);
  out.emplace_back("in.t", b.t);
  out.emplace_back("in.y", b.c.y);
  out.emplace_back("in.mask", b.c.mask);
  out.emplace_back("in.drop", b.c.drop);
  out.emplace_back("in.control", b.c.control);
  out.emplace_back("out.pred", pred);
  sana::write_safetensors(dir.path("case.safetensors"), out, {{"spec", sana::test::reference_spec_json(spec).dump()}, {"case", "controlnet"}});
  const std::string script = std::string(SANA_SOURCE_DIR) + "/tests/reference/upstream_model.py";
  const auto r = sana::test::run_command(SANA_PYTHON " " + script + " " + dir.path("case.safetensors"));
  INFO(r.output);
  CHECK(r.exit_code == 0);  // strict load of our names into upstream's modules, forward within 1e-5
  CHECK(r.output.find("controlnet: max relative difference") != std::string::npos);
  WARN(r.output);

  // Upstream's modules' own state dict (their names, their initialisation) loads here strictly.
  const auto saved = sana::test::run_command(fmt::format(SANA_PYTHON " {} --save-init '{}' {} {} {}", script,
                                                         sana::test::reference_spec_json(spec).dump(), spec.caption_channels,
                                                         spec.caption_tokens, dir.path("upstream.safetensors")));
  INFO(saved.output);
  REQUIRE(saved.exit_code == 0);
  SanaMS ours(spec, BuildOptions{torch::kFloat32, false, 1});
  const auto report = load_weights(*ours, dir.path("upstream.safetensors"), /*strict=*/true);
  CHECK(report.clean());
  CHECK(report.loaded == static_cast<int64_t>(ours->named_parameters().size() + ours->named_buffers().size()));
  const auto file = sana::read_safetensors(dir.path("upstream.safetensors"));
  CHECK(torch::equal(ours->named_parameters()["controlnet.2.after_proj.weight"],
                     file.get("controlnet.2.after_proj.weight")));
}

TEST_CASE("a ControlNet starts from a base model's file and keeps its control blocks across a resume",
          "[model][controlnet]") {
  sana::test::TempDir dir;
  auto spec = control_spec();
  auto base_spec = spec;
  base_spec.control_blocks = 0;
  SanaMS base(base_spec, BuildOptions{torch::kFloat32, false, 11});
  const auto base_file = dir.path("base.safetensors");
  save_weights(*base, base_file);
  SanaMS net(spec, BuildOptions{torch::kFloat32, false, 3});  // another seed: everything comes from the file
  const auto report = load_controlnet_weights(*net, base_file, /*strict=*/true);
  CHECK(report.clean());
  const auto loaded = net->named_parameters();
  for (const auto& p : base->named_parameters()) CHECK(torch::equal(loaded[p.key()], p.value()));
  for (int64_t i = 0; i < spec.control_blocks; ++i) {  // upstream's initialize_all_and_copy_from_base
    const auto copy = net->controlnet[static_cast<size_t>(i)]->named_parameters();
    for (const auto& p : base->blocks[static_cast<size_t>(i)]->named_parameters()) {
      CHECK(torch::equal(copy["copied_block." + p.key()], p.value()));
    }
    CHECK(copy["after_proj.weight"].abs().sum().item<double>() == 0);
  }
  // A file with the control blocks loads them as they are.
  {
    torch::NoGradGuard no_grad;
    loaded["controlnet.0.after_proj.weight"].fill_(0.5);
  }
  const auto control_file = dir.path("controlnet.safetensors");
  save_weights(*net, control_file);
  SanaMS again(spec, BuildOptions{torch::kFloat32, false, 3});
  CHECK(load_controlnet_weights(*again, control_file, true).clean());
  CHECK(again->named_parameters()["controlnet.0.after_proj.weight"].eq(0.5).all().item<bool>());

  // Training: the base is frozen, the control blocks are the state, tied to the base's checksum.
  ControlNetState state(*net, "base-sum");
  int64_t control = 0;
  for (const auto& p : net->named_parameters()) {
    CHECK(p.value().requires_grad() == is_control_parameter(p.key()));
    control += is_control_parameter(p.key()) ? 1 : 0;
  }
  CHECK(static_cast<int64_t>(state.parameters().size()) == control);
  const auto saved = state.save_state();
  CHECK(saved.metadata.at("base_checksum") == "base-sum");
  ControlNetState fresh(*again, "base-sum");
  {
    torch::NoGradGuard no_grad;
    again->named_parameters()["controlnet.0.after_proj.weight"].zero_();
  }
  fresh.restore_state(&saved, "checkpoint");
  CHECK(again->named_parameters()["controlnet.0.after_proj.weight"].eq(0.5).all().item<bool>());
  ControlNetState other_base(*again, "another-base");
  CHECK_THROWS_AS(other_base.restore_state(&saved, "checkpoint"), WeightsError);
  CHECK_THROWS_AS(fresh.restore_state(nullptr, "checkpoint"), WeightsError);
}

// diffusers as the judge (tests/reference/diffusers_controlnet.py): SanaControlNetModel and
// SanaTransformer2DModel load our export_controlnet_diffusers folders cleanly, and their
// modules, wired as upstream's SanaMSControlNet (diffusers' own pipeline wires them otherwise:
// the script says how), give our output at a conditioning scale other than 1.
TEST_CASE("diffusers' SanaControlNetModel loads our ControlNet export and in upstream's wiring computes our forward", "[torch][controlnet]") {
  sana::test::TempDir dir;
  const auto spec = control_spec(3);
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 23});
  sana::test::perturb(model, 24);  // the zero projections too: the control blocks must count
  auto b = batch_for(spec, torch::kFloat32);
  b.c.drop = torch::Tensor();
  b.c.control_scale = 0.7;
  b.t = torch::tensor({31.0f, 702.0f});  // whole numbers: upstream truncates, diffusers does not
  torch::Tensor pred;
  {
    torch::NoGradGuard no_grad;
    model->eval();
    pred = model->forward(b.x, b.t, b.c);
  }
  TensorMap tensors;
  for (const auto& [name, t] : module_tensors(*model)) tensors[name] = t;
  export_controlnet_diffusers(tensors, spec, 16, dir.path("export"));
  sana::NamedTensors out = {{"in.x", b.x}, {"in.t", b.t}, {"in.y", b.c.y}, {"in.mask", b.c.mask},
                            {"in.control", b.c.control}, {"out.pred", pred}};
  sana::write_safetensors(dir.path("case.safetensors"), out, {{"scale", "0.7"}, {"tolerance", "1e-5"}});
  const auto r = sana::test::run_command(SANA_PYTHON " " + std::string(SANA_SOURCE_DIR) +
                                         "/tests/reference/diffusers_controlnet.py " + dir.path("case.safetensors") +
                                         " " + dir.path("export"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("their modules in upstream's wiring: max relative difference") != std::string::npos);
  WARN(r.output);
}
