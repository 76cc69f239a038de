// Half working copies of the trained weights (model/working_weights.h), on the CPU under
// CPU bf16 autocast, which casts the products' weights as CUDA's does: two micro-batches
// with gradient checkpointing give bitwise autocast's losses and gradients while each
// weight is cast once, and an in-place update of the weights (the optimizer's) is seen.
#include "catch.h"
#include <torch/torch.h>

#include <vector>

#include "sana/diffusion/flow_matching.h"
#include "sana/model/autocast.h"
#include "sana/model/sana_ms.h"
#include "sana/model/working_weights.h"
#include "model_specs.h"

using namespace sana::model;

namespace {

// CPU autocast in bf16, CUDA's off.
const AutocastState kCpuBf16{false, at::kBFloat16, true, at::kBFloat16};

struct MicroBatch {
  torch::Tensor x, t;
  Condition c;
};

std::vector<MicroBatch> micro_batches(const ModelSpec& spec) {
  torch::manual_seed(5);
  std::vector<MicroBatch> out;
  for (int k = 0; k < 2; ++k) {
    const auto x0 = torch::randn({2, spec.in_channels, 8, 8});
    const auto flow = sana::diffusion::make_flow_batch(x0, {3u + k, 4u + k}, 5, 0, sana::diffusion::TimestepOptions{});
    MicroBatch b{flow.noisy, flow.timesteps, {}};
    b.c.y = torch::randn({2, spec.caption_tokens, spec.caption_channels});
    b.c.mask = torch::ones({2, spec.caption_tokens}, torch::kInt64);
    out.push_back(b);
  }
  return out;
}

struct StepResult {
  std::vector<torch::Tensor> losses, grads;
};

// One optimizer step's forwards and backwards (the gradients accumulated), under CPU bf16
// autocast; each forward in its own autocast region, as TrainStep enters one per micro-batch.
StepResult run_step(SanaMS& model, const std::vector<MicroBatch>& batches) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  StepResult r;
  for (const auto& b : batches) {
    torch::Tensor loss;
    {
      AutocastGuard amp(kCpuBf16);
      loss = model->forward(b.x, b.t, b.c).to(torch::kFloat).pow(2).mean();
    }
    loss.backward();
    r.losses.push_back(loss.detach().clone());
  }
  for (const auto& p : model->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return r;
}

void check_same(const StepResult& a, const StepResult& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t k = 0; k < a.losses.size(); ++k) CHECK(torch::equal(a.losses[k], b.losses[k]));
  REQUIRE(a.grads.size() == b.grads.size());
  size_t differing = 0, compared = 0;
  for (size_t k = 0; k < a.grads.size(); ++k) {
    if (!a.grads[k].defined() || !b.grads[k].defined()) {
      CHECK(a.grads[k].defined() == b.grads[k].defined());
      continue;
    }
    ++compared;
    if (!torch::equal(a.grads[k], b.grads[k])) ++differing;
  }
  CHECK(compared > 20);
  CHECK(differing == 0);
}

}  // namespace

TEST_CASE("working weights: autocast's losses and gradients bitwise, each weight cast once a step",
          "[model][working_weights]") {
  const auto spec = sana::test::small_spec();
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(77);
    for (auto& p : model->parameters()) p.add_(torch::randn(p.sizes()) * 0.02);  // off the zero inits
  }
  model->set_grad_checkpointing(true);
  model->train();
  const auto batches = micro_batches(spec);

  const auto autocast_only = run_step(model, batches);
  const int64_t layers = use_working_weights(*model, true);
  CHECK(layers > 10);
  const auto working = run_step(model, batches);
  check_same(autocast_only, working);
  auto use = working_weights_use(*model);
  CHECK(use.layers == layers);
  CHECK(use.casts == layers);  // two forwards and their recomputes: one cast each
  CHECK(use.bytes == 2 * working_elements(*model, [](const std::string&) { return true; }));

  // The optimizer's in-place update: the next step casts again, and matches autocast on it.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(p.grad(), -0.5);
  }
  const auto updated = run_step(model, batches);
  use = working_weights_use(*model);
  CHECK(use.casts == 2 * layers);
  CHECK_FALSE(torch::equal(updated.losses[0], working.losses[0]));
  use_working_weights(*model, false);
  CHECK(working_weights_use(*model).layers == 0);
  check_same(run_step(model, batches), updated);
}

TEST_CASE("working weights: none made without autocast or for a frozen weight", "[model][working_weights]") {
  const auto spec = sana::test::small_spec();
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  model->final_layer->linear->weight.requires_grad_(false);
  const int64_t layers = use_working_weights(*model, true);
  const auto b = micro_batches(spec).front();
  model->forward(b.x, b.t, b.c).pow(2).mean().backward();  // fp32: the weights themselves
  CHECK(working_weights_use(*model).casts == 0);
  CHECK(model->final_layer->linear->working == nullptr);
  {
    AutocastGuard amp(kCpuBf16);
    model->forward(b.x, b.t, b.c).to(torch::kFloat).pow(2).mean().backward();
  }
  CHECK(working_weights_use(*model).casts == layers);
}
