// Block swapping (model/swapped_blocks.h) on the CPU, where the copies are real copies through
// the same calls as on a GPU: LoRA on a frozen base (fp32 and NF4) gives bitwise the losses and
// adapter gradients of the unswapped model, with and without gradient checkpointing, over
// two micro-batches; each swapped block is copied in once for the forward and once for the
// backward, at most two are on the device at once, and none is once the backward is over.
// A full fine-tune with trained blocks swapped: the gradients of every parameter bitwise, and
// an update written into the host memory of a swapped block is what the next forward reads.
#include "catch.h"
#include <torch/torch.h>

#include <optional>

#include "sana/diffusion/flow_matching.h"
#include "sana/model/frozen_storage.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/model/swapped_blocks.h"
#include "model_specs.h"

using namespace sana::model;

namespace {

SanaMS frozen_model(const ModelSpec& spec, StorageDtype dtype) {
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  torch::NoGradGuard no_grad;
  torch::manual_seed(77);
  for (auto& p : model->parameters()) p.add_(torch::randn(p.sizes()) * 0.02);
  for (auto& p : model->parameters()) p.requires_grad_(false);
  store_frozen_layers(*model, dtype, [](const std::string&) { return true; });
  return model;
}

struct Run {
  std::vector<double> losses;
  std::vector<torch::Tensor> grads;
};

// The flow-matching loss of one micro-batch of two 8x8 samples drawn from `seed`.
torch::Tensor flow_loss(SanaMSImpl& model, int seed, int micro) {
  torch::manual_seed(seed);
  const auto& spec = model.spec();
  const auto x0 = torch::randn({2, spec.in_channels, 8, 8});
  const auto flow = sana::diffusion::make_flow_batch(x0, {3, 4}, 5 + micro, 0, sana::diffusion::TimestepOptions{});
  Condition c;
  c.y = torch::randn({2, spec.caption_tokens, spec.caption_channels});
  c.mask = torch::ones({2, spec.caption_tokens}, torch::kInt64);
  return (model.forward(flow.noisy, flow.timesteps, c) - flow.target).pow(2).mean();
}

// Two micro-batches' forward and backward of LoRA r4 on `model`, the adapters' B nonzero.
Run train_two(SanaMSImpl& model, Lora& lora) {
  Run r;
  for (const auto& [name, t] : lora.parameters()) t.mutable_grad() = torch::Tensor();
  for (int micro = 0; micro < 2; ++micro) {
    const auto loss = flow_loss(model, 30 + micro, micro);
    loss.backward();
    r.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, t] : lora.parameters()) r.grads.push_back(t.grad().clone());
  return r;
}

std::unique_ptr<Lora> adapters_on(SanaMSImpl& model, StorageDtype dtype) {
  LoraOptions o;
  o.rank = 4;
  o.targets = {"to_q", "to_k", "to_v", "conv_inverted", "conv_point", "proj_out"};
  auto lora = std::make_unique<Lora>(model, o, stored_base_checksum(dtype, "base"));
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  for (const auto& [name, t] : lora->parameters()) {
    if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.05);
  }
  return lora;
}

}  // namespace

TEST_CASE("swapped_block_ids: the last N blocks, or a fraction of them, and no more than the model has",
          "[model][swap]") {
  CHECK(swapped_block_ids(0, 4).empty());
  CHECK(swapped_block_ids(2, 4) == std::vector<int64_t>{2, 3});
  CHECK(swapped_block_ids(4, 4) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(swapped_block_ids(0.5, 20).size() == 10);
  CHECK(swapped_block_ids(0.99, 4) == std::vector<int64_t>{1, 2, 3});
  CHECK_THROWS_WITH(swapped_block_ids(5, 4), Catch::Contains("up to the model's 4"));
  CHECK_THROWS_WITH(swapped_block_ids(1.5, 4), Catch::Contains("a count of blocks"));
}

TEST_CASE("a swapped frozen base trains LoRA bitwise as the unswapped one, copying each block in twice a step",
          "[model][swap]") {
  auto spec = sana::test::small_spec();
  spec.depth = 4;  // three swapped blocks: one copied in ahead while another computes
  const auto dtype = GENERATE(StorageDtype::fp32, StorageDtype::nf4);
  const bool checkpointing = GENERATE(false, true);
  INFO(storage_dtype_name(dtype) << (checkpointing ? ", gradient checkpointing" : ""));
  auto plain = frozen_model(spec, dtype);
  auto plain_lora = adapters_on(*plain, dtype);
  plain->set_grad_checkpointing(checkpointing);
  plain->train();
  const auto want = train_two(*plain, *plain_lora);

  auto model = frozen_model(spec, dtype);
  auto lora = adapters_on(*model, dtype);
  model->set_grad_checkpointing(checkpointing);
  model->train();
  const auto ids = swapped_block_ids(spec.depth - 1, spec.depth);  // all but block 0
  REQUIRE(ids.front() == 1);
  SwappedBlocks swapped(*model, ids, torch::kCPU);
  CHECK(swapped.host_bytes() > 0);
  CHECK(swapped.copied_bytes() == 0);
  // The parameters of a swapped block are its host copies between uses, with their values.
  const auto block1 = model->blocks->children()[1]->named_parameters();
  const auto plain1 = plain->blocks->children()[1]->named_parameters();
  for (const auto& p : block1) CHECK(torch::equal(p.value(), plain1[p.key()]));

  const auto got = train_two(*model, *lora);
  CHECK(got.losses == want.losses);
  REQUIRE(got.grads.size() == want.grads.size());
  for (size_t k = 0; k < got.grads.size(); ++k) {
    INFO(lora->parameters()[k].first);
    CHECK(torch::equal(got.grads[k], want.grads[k]));
    CHECK(got.grads[k].abs().sum().item<double>() > 0);
  }
  // Two micro-batches, each a forward and a backward that copy every swapped block in once.
  CHECK(swapped.copied_bytes() == 4 * swapped.host_bytes());
  CHECK(swapped.peak_blocks() == 2);
  CHECK(swapped.blocks_on_device() == 0);  // the backward is over
  // A forward without a backward (a preview) copies each block in once and lets it go.
  {
    torch::NoGradGuard no_grad;
    const auto before = swapped.copied_bytes();
    model->eval();
    Condition c;
    c.y = torch::randn({1, spec.caption_tokens, spec.caption_channels});
    c.mask = torch::ones({1, spec.caption_tokens}, torch::kInt64);
    model->forward(torch::randn({1, spec.in_channels, 8, 8}), torch::full({1}, 500.0), c);
    CHECK(swapped.copied_bytes() - before == swapped.host_bytes());
    CHECK(swapped.blocks_on_device() == 0);
  }
  for (const auto& p : block1) CHECK(torch::equal(p.value(), plain1[p.key()]));
}

namespace {

SanaMS trained_model(const ModelSpec& spec) {
  SanaMS model(spec, BuildOptions{torch::kFloat32, false, 21});
  torch::NoGradGuard no_grad;
  torch::manual_seed(78);
  for (auto& p : model->parameters()) p.add_(torch::randn(p.sizes()) * 0.02);
  return model;
}

// Two micro-batches of a full fine-tune, then an SGD step written into the parameters where
// they are (a swapped block's: its host memory, as the host optimizer writes them), then a
// third forward: its loss reads the updated weights.
Run train_full(SanaMSImpl& model) {
  Run r;
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  const auto step = [&](int micro, bool backward) {
    std::optional<torch::NoGradGuard> no_grad;
    if (!backward) no_grad.emplace();  // a forward alone lets its blocks go at its end
    const auto loss = flow_loss(model, 40 + micro, micro);
    if (backward) loss.backward();
    r.losses.push_back(loss.item<double>());
  };
  step(0, true);
  step(1, true);
  for (const auto& p : model.parameters()) r.grads.push_back(p.grad().clone());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters()) p.sub_(p.grad() * 0.5);
  }
  step(2, false);
  return r;
}

}  // namespace

TEST_CASE("swapped trained blocks: a full fine-tune's gradients, and the weights updated in host memory, bitwise",
          "[model][swap]") {
  auto spec = sana::test::small_spec();
  spec.depth = 4;
  const bool checkpointing = GENERATE(false, true);
  INFO((checkpointing ? "gradient checkpointing" : "no checkpointing"));
  auto plain = trained_model(spec);
  plain->set_grad_checkpointing(checkpointing);
  plain->train();
  const auto want = train_full(*plain);

  auto model = trained_model(spec);
  model->set_grad_checkpointing(checkpointing);
  model->train();
  SwappedBlocks swapped(*model, swapped_block_ids(3, spec.depth), torch::kCPU, /*trained=*/true);
  CHECK(swapped.trained());
  // Every parameter of blocks 1 to 3 swaps, trained or not; block 0's stay.
  int64_t block_params = 0;
  for (size_t k = 1; k < 4; ++k) block_params += static_cast<int64_t>(model->blocks->children()[k]->parameters().size());
  CHECK(static_cast<int64_t>(swapped.parameters().size()) == block_params);
  for (const auto& p : swapped.parameters()) CHECK(p.requires_grad());

  const auto got = train_full(*model);
  CHECK(got.losses == want.losses);
  CHECK(got.losses[2] != got.losses[0]);  // the step moved the weights
  REQUIRE(got.grads.size() == want.grads.size());
  for (size_t k = 0; k < got.grads.size(); ++k) CHECK(torch::equal(got.grads[k], want.grads[k]));
  CHECK(swapped.peak_blocks() <= 2);
  CHECK(swapped.blocks_on_device() == 0);
  // Three forwards and two backwards: each copies every swapped block in once.
  CHECK(swapped.copied_bytes() == 5 * swapped.host_bytes());
  const auto trained = plain->named_parameters();
  for (const auto& p : model->named_parameters()) CHECK(torch::equal(p.value(), trained[p.key()]));
}
