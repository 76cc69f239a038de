// A frozen base in bf16, int8, fp8 or NF4 (model/frozen_storage.h): each stored layer gives,
// on the activations the model itself feeds it, its fp32 output within its format's rounding;
// NF4 is bitsandbytes' own (tests/reference/bnb_nf4.py runs it), fp8 torch's e4m3 cast; the
// backward gives the input the gradient of the restored weight's product and saves no
// full-precision weight; LoRA wraps a stored layer as any other.
#include "catch.h"
#include <torch/torch.h>

#include <map>

#include "sana/diffusion/flow_matching.h"
#include "sana/model/frozen_storage.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/util/safetensors.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana::model;

namespace {

// Wrapped around every Linear (tests only): keeps the inputs the model gives it.
class RecordingLinearImpl : public LinearImpl {
 public:
  explicit RecordingLinearImpl(std::shared_ptr<LinearImpl> base) : LinearImpl(*base), base_(std::move(base)) {}
  torch::Tensor forward(const torch::Tensor& x) override {
    inputs.push_back(x.detach().clone());
    return base_->forward(x);
  }
  std::shared_ptr<LinearImpl> base_;
  std::vector<torch::Tensor> inputs;
};

struct Batch {
  torch::Tensor x, t;
  Condition c;
};

Batch batch_for(const ModelSpec& spec) {
  torch::manual_seed(8);
  const auto x0 = torch::randn({2, spec.in_channels, 8, 8});
  const auto flow = sana::diffusion::make_flow_batch(x0, {3, 4}, 5, 0, sana::diffusion::TimestepOptions{});
  Batch b{flow.noisy, flow.timesteps, {}};
  b.c.y = torch::randn({2, spec.caption_tokens, spec.caption_channels});
  b.c.mask = torch::ones({2, spec.caption_tokens}, torch::kInt64);
  return b;
}

SanaMS trained_like_model(const ModelSpec& spec) {
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  torch::NoGradGuard no_grad;
  torch::manual_seed(77);  // the same weights at every call
  // Away from the initialisation's zeros (adaLN tables, output layers), as trained weights are.
  for (auto& p : model->parameters()) p.add_(torch::randn(p.sizes()) * 0.02);
  for (auto& p : model->parameters()) p.requires_grad_(false);
  return model;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm()).item<double>();
}

}  // namespace

TEST_CASE("int8 storage: per output channel, symmetric, within half a step of each weight", "[model][frozen]") {
  torch::manual_seed(2);
  auto w = torch::randn({6, 5}) * torch::linspace(0.01, 3, 6).unsqueeze(1);
  w[2].zero_();
  const auto [q, scale] = quantize_int8(w);
  CHECK(q.scalar_type() == torch::kChar);
  CHECK(scale.sizes() == torch::IntArrayRef{6});
  CHECK(scale[2].item<float>() == 1.0f);  // an all-zero row
  CHECK(q.abs().amax(1).index({torch::tensor({0, 1, 3, 4, 5})}).eq(127).all().item<bool>());
  const auto back = dequantize_int8(q, scale, torch::kFloat32);
  CHECK(((back - w).abs() <= scale.unsqueeze(1) / 2 + 1e-7).all().item<bool>());
}

TEST_CASE("fp8 storage: torch's float8_e4m3fn cast of the weight over per-channel scales", "[model][frozen]") {
  torch::manual_seed(3);
  auto w = torch::randn({6, 5, 1, 1}) * torch::linspace(0.01, 3, 6).view({6, 1, 1, 1});
  w[2].zero_();
  const auto s = store_weight(w, StorageDtype::fp8);
  REQUIRE(s.codes.scalar_type() == torch::kFloat8_e4m3fn);
  REQUIRE(s.scale.sizes() == torch::IntArrayRef{6});
  CHECK(s.scale[2].item<float>() == 1.0f);  // an all-zero row
  const auto rows = w.flatten(1);
  const auto scale = (rows.abs().amax(1) / 448).index_put_({2}, 1.0);
  CHECK(torch::equal(s.scale, scale));
  const auto cast = (rows / scale.unsqueeze(1)).to(torch::kFloat8_e4m3fn);
  CHECK(torch::equal(s.codes.flatten(1).view(torch::kByte), cast.view(torch::kByte)));
  CHECK(s.codes.to(torch::kFloat32).abs().amax(1).index({torch::tensor({0, 1, 3, 4, 5})}).eq(448).all().item<bool>());
  CHECK(torch::equal(restore_weight(s, torch::kFloat32), (cast.to(torch::kFloat32) * scale.unsqueeze(1)).view(w.sizes())));
  // e4m3 keeps 3 mantissa bits: each weight within 1/16 of itself (relative), or 2^-9 of its row's scale.
  const auto back = restore_weight(s, torch::kFloat32);
  CHECK(((back - w).abs() <= w.abs() / 16 + scale.view({6, 1, 1, 1}) * std::pow(2.0, -9)).all().item<bool>());
}

// bitsandbytes' quantize_4bit / dequantize_4bit on the same weights, run by the pinned package:
// shapes with a short last block, an odd count, an all-zero block and a 1x1 convolution.
TEST_CASE("NF4 storage computes what bitsandbytes' quantize_4bit and dequantize_4bit compute", "[model][frozen]") {
  torch::manual_seed(11);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"rows", {70, 65}}, {"odd", {63, 65}}, {"zero", {64, 64}}, {"conv", {96, 32, 1, 1}}, {"wide", {1024, 600}}};
  sana::NamedTensors file;
  for (const auto& [name, shape] : shapes) {
    auto w = torch::randn(shape) * 0.02;
    w.view({-1}).slice(0, 0, w.numel(), 97).mul_(8);  // outliers, as trained weights have
    if (name == "zero") w[0].zero_();                  // the first block all zeros
    file.emplace_back("w." + name, w);
    for (const auto dtype : {StorageDtype::nf4, StorageDtype::nf4_dq}) {
      const auto s = store_weight(w, dtype);
      const std::string kind = dtype == StorageDtype::nf4 ? "nf4." : "dq.";
      CHECK(s.codes.numel() == (w.numel() + 1) / 2);
      CHECK(s.absmax.numel() == (w.numel() + 63) / 64);
      file.emplace_back(kind + name + ".codes", s.codes);
      file.emplace_back(kind + name + ".absmax", s.absmax);
      if (dtype == StorageDtype::nf4_dq) {
        file.emplace_back(kind + name + ".nested_absmax", s.nested_absmax);
        file.emplace_back(kind + name + ".offset", s.offset);
      }
      file.emplace_back(kind + name + ".restored", restore_weight(s, torch::kFloat32));
      file.emplace_back(kind + name + ".restored_bf16", restore_weight(s, torch::kBFloat16));
      CHECK(restore_weight(s, torch::kFloat32).sizes() == w.sizes());
    }
  }
  sana::test::TempDir dir;
  const auto path = dir.path("case.safetensors");
  sana::write_safetensors(path, file, {});
  const auto r = sana::test::run_command(SANA_PYTHON " " + std::string(SANA_SOURCE_DIR) + "/tests/reference/bnb_nf4.py " +
                                         path);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("wide nf4-dq restored bf16 (our state): bitwise equal") != std::string::npos);
}

TEST_CASE("every stored dtype gives each layer's fp32 output on the model's own activations",
          "[model][frozen]") {
  const auto spec = sana::test::small_spec();
  const auto b = batch_for(spec);
  // Every Linear's inputs in an fp32 forward, and its fp32 weights.
  auto model = trained_like_model(spec);
  std::map<std::string, std::shared_ptr<RecordingLinearImpl>> recorders;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> fp32;
  for (const auto& item : model->named_modules("", false)) {
    auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value());
    if (!linear) continue;
    fp32[item.key()] = {linear->weight.clone(), linear->bias.defined() ? linear->bias.clone() : torch::Tensor()};
    recorders[item.key()] = std::make_shared<RecordingLinearImpl>(linear);
  }
  for (const auto& [path, r] : recorders) replace_layer(*model, path, r);
  torch::NoGradGuard no_grad;
  const auto reference = model->forward(b.x, b.t, b.c);
  REQUIRE(recorders.size() >= 10);

  // Per dtype: how much smaller the weights get, and the worst layer's relative error allowed.
  struct Format {
    StorageDtype dtype;
    double smaller, layer_error, model_error;
    int64_t extra_per_layer;  // what turns the codes back: parameters beside each weight
  };
  for (const auto& f : {Format{StorageDtype::bf16, 1.9, 0.005, 0.03, 0}, Format{StorageDtype::int8, 3, 0.01, 0.03, 1},
                        Format{StorageDtype::fp8, 3, 0.05, 0.1, 1}, Format{StorageDtype::nf4, 6, 0.15, 0.3, 1},
                        Format{StorageDtype::nf4_dq, 6.5, 0.15, 0.3, 3}}) {
    const auto dtype = f.dtype;
    INFO(storage_dtype_name(dtype));
    auto stored = trained_like_model(spec);
    const auto names = stored->named_parameters().keys();
    const auto report = store_frozen_layers(*stored, dtype, [](const std::string&) { return true; });
    CHECK(frozen_storage_dtype(*stored) == dtype);
    CHECK(report.bytes_after < report.bytes_before / f.smaller);
    const auto after = stored->named_parameters();
    int64_t extra = 0;
    for (const auto& name : names) CHECK(after.contains(name));  // the base's names stay
    for (const auto& item : after) extra += item.key().find(".weight_") != std::string::npos;
    CHECK(extra == f.extra_per_layer * report.layers);
    CHECK(restored_tensors(*stored).size() == names.size() + stored->named_buffers().size());
    const auto modules = stored->named_modules("", false);
    double worst = 0;
    for (const auto& [path, r] : recorders) {
      auto* layer = modules[path]->as<LinearImpl>();
      REQUIRE(layer != nullptr);
      for (const auto& x : r->inputs) {
        const auto want = torch::linear(x, fp32[path].first, fp32[path].second);
        worst = std::max(worst, relative(layer->forward(x), want));
      }
    }
    WARN(storage_dtype_name(dtype) << ": worst layer " << worst << ", model "
                                   << relative(stored->forward(b.x, b.t, b.c), reference));
    CHECK(worst < f.layer_error);
    CHECK(relative(stored->forward(b.x, b.t, b.c), reference) < f.model_error);
  }
}

TEST_CASE("a stored layer's backward: the input's gradient of the restored product, none for the weight",
          "[model][frozen]") {
  auto model = trained_like_model(sana::test::small_spec());
  store_frozen_layers(*model, StorageDtype::int8, [](const std::string& p) { return p == "final_layer.linear"; });
  auto* stored = model->final_layer->linear.get();
  const auto params = model->named_parameters();
  REQUIRE(params.contains("final_layer.linear.weight_scale"));
  CHECK(params["final_layer.linear.weight"].scalar_type() == torch::kChar);
  CHECK(params["blocks.0.attn.qkv.weight"].scalar_type() == torch::kFloat32);  // not chosen
  const auto w = dequantize_int8(stored->weight, params["final_layer.linear.weight_scale"], torch::kFloat32);
  const auto x = torch::randn({3, 4, model->spec().hidden}, torch::requires_grad());
  const auto x2 = x.detach().clone().requires_grad_(true);
  stored->forward(x).pow(2).sum().backward();
  torch::linear(x2, w, stored->bias).pow(2).sum().backward();
  CHECK(torch::allclose(x.grad(), x2.grad(), 1e-5, 1e-6));
  CHECK_FALSE(stored->weight.grad().defined());
}

TEST_CASE("NF4 and fp8 layers: the input's gradient of the restored product, in a Linear and in convolutions",
          "[model][frozen]") {
  for (const auto dtype : {StorageDtype::fp8, StorageDtype::nf4, StorageDtype::nf4_dq}) {
    INFO(storage_dtype_name(dtype));
    auto model = trained_like_model(sana::test::small_spec());
    const std::vector<std::string> chosen = {"final_layer.linear", "blocks.0.mlp.inverted_conv.conv",
                                             "blocks.0.mlp.depth_conv.conv"};
    const auto originals = model->named_modules("", false);
    std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> fp32;  // weight, bias
    for (const auto& path : chosen) {
      REQUIRE(originals.contains(path));
      const auto& m = originals[path];
      auto* l = m->as<LinearImpl>();
      auto* c = m->as<Conv2dImpl>();
      REQUIRE((l != nullptr || c != nullptr));
      fp32[path] = l ? std::make_pair(l->weight.clone(), l->bias) : std::make_pair(c->weight.clone(), c->bias);
    }
    const auto report = store_frozen_layers(*model, dtype, [&](const std::string& p) {
      return std::find(chosen.begin(), chosen.end(), p) != chosen.end();
    });
    CHECK(report.layers == 3);
    const auto modules = model->named_modules("", false);
    for (const auto& path : chosen) {
      INFO(path);
      const auto& m = modules[path];
      const auto restored = [&] {
        for (const auto& [name, t] : restored_tensors(*model)) {
          if (name == path + ".weight") return t;
        }
        return torch::Tensor();
      }();
      REQUIRE(restored.defined());
      CHECK(restored.sizes() == fp32[path].first.sizes());
      CHECK(relative(restored, fp32[path].first) < (dtype == StorageDtype::fp8 ? 0.05 : 0.15));
      torch::Tensor x, y, y2;
      auto x2 = torch::Tensor();
      if (auto* l = m->as<LinearImpl>()) {
        CHECK(l->weight_shape() == fp32[path].first.sizes().vec());
        x = torch::randn({3, 4, restored.size(1)}, torch::requires_grad());
        x2 = x.detach().clone().requires_grad_(true);
        y = l->forward(x);
        y2 = torch::linear(x2, restored, fp32[path].second);
      } else {
        auto* c = m->as<Conv2dImpl>();
        CHECK(c->weight_shape() == fp32[path].first.sizes().vec());
        x = torch::randn({2, restored.size(1) * c->groups, 4, 4}, torch::requires_grad());
        x2 = x.detach().clone().requires_grad_(true);
        y = c->forward(x);
        y2 = torch::conv2d(x2, restored, fp32[path].second, c->stride, c->padding, 1, c->groups);
      }
      CHECK(torch::allclose(y, y2, 1e-5, 1e-6));
      y.pow(2).sum().backward();
      y2.pow(2).sum().backward();
      CHECK(torch::allclose(x.grad(), x2.grad(), 1e-4, 1e-6));
    }
    for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
  }
}

TEST_CASE("LoRA on an int8 or NF4 base: fp32 adapters, the same gradients with gradient checkpointing",
          "[model][frozen]") {
  const auto dtype = GENERATE(StorageDtype::int8, StorageDtype::nf4_dq);
  INFO(storage_dtype_name(dtype));
  const auto spec = sana::test::small_spec();
  auto model = trained_like_model(spec);
  store_frozen_layers(*model, dtype, [](const std::string&) { return true; });
  LoraOptions o;
  o.rank = 4;
  o.targets = {"to_q", "to_k", "to_v", "conv_inverted", "conv_point", "proj_out"};
  Lora lora(*model, o, stored_base_checksum(dtype, "base"));
  for (const auto& [name, t] : lora.parameters()) CHECK(t.scalar_type() == torch::kFloat32);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : lora.parameters()) {
      if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.05);
    }
  }
  const auto b = batch_for(spec);
  std::vector<torch::Tensor> plain, checkpointed;
  for (const bool on : {false, true}) {
    model->set_grad_checkpointing(on);
    model->train();
    for (const auto& [name, t] : lora.parameters()) t.mutable_grad() = torch::Tensor();
    model->forward(b.x, b.t, b.c).pow(2).mean().backward();
    for (const auto& [name, t] : lora.parameters()) (on ? checkpointed : plain).push_back(t.grad().clone());
  }
  for (size_t k = 0; k < plain.size(); ++k) {
    INFO(lora.parameters()[k].first);
    CHECK(torch::allclose(plain[k], checkpointed[k], 1e-5, 1e-7));
    CHECK(plain[k].abs().sum().item<double>() > 0);
  }
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());  // the base gets none
}

TEST_CASE("storage on the meta device: the dtypes and shapes alone", "[model][frozen]") {
  const auto spec = sana::test::small_spec();
  SanaMS meta(spec, BuildOptions{torch::kFloat32, true, 0});
  for (auto& p : meta->parameters()) p.requires_grad_(false);
  const auto r = store_frozen_layers(*meta, StorageDtype::int8, [](const std::string&) { return true; });
  CHECK(r.layers > 0);
  const auto params = meta->named_parameters();
  CHECK(params["blocks.0.attn.qkv.weight"].scalar_type() == torch::kChar);
  CHECK(params["blocks.0.attn.qkv.weight_scale"].sizes() == torch::IntArrayRef{3 * spec.hidden});
  CHECK(params["blocks.0.attn.qkv.weight"].is_meta());
}

TEST_CASE("restored_tensors: the whole model in fp32, each stored weight as its layer computes with it",
          "[model][frozen]") {
  const auto spec = sana::test::small_spec();
  auto plain = trained_like_model(spec);
  std::vector<std::pair<std::string, torch::Tensor>> want;
  for (const auto& p : plain->named_parameters()) want.emplace_back(p.key(), p.value().clone());
  for (const auto& b : plain->named_buffers()) want.emplace_back(b.key(), b.value().clone());
  for (const auto dtype : {StorageDtype::bf16, StorageDtype::int8}) {
    auto model = trained_like_model(spec);
    // Only the blocks' layers stored, as a ControlNet stores its base and not its control blocks.
    const auto r = store_frozen_layers(*model, dtype, [](const std::string& layer) { return layer.rfind("blocks.", 0) == 0; });
    REQUIRE(r.layers > 0);
    const auto got = restored_tensors(*model);
    REQUIRE(got.size() == want.size());  // no weight_scale
    int64_t rounded = 0, exact = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& [name, t] = got[i];
      REQUIRE(name == want[i].first);
      REQUIRE(t.scalar_type() == torch::kFloat32);
      const auto& w = want[i].second;
      const bool stored = name.rfind("blocks.", 0) == 0 && name.size() > 7 && name.substr(name.size() - 7) == ".weight" &&
                          w.dim() >= 2;
      if (!stored) {
        exact += torch::equal(t, w) ? 1 : 0;
        continue;
      }
      const auto expected = dtype == StorageDtype::bf16
                                ? w.to(torch::kBFloat16).to(torch::kFloat32)
                                : dequantize_int8(quantize_int8(w).first, quantize_int8(w).second, torch::kFloat32);
      rounded += torch::equal(t, expected) ? 1 : 0;
    }
    CHECK(rounded == r.layers);
    CHECK(exact + rounded == static_cast<int64_t>(got.size()));
  }
}
