// ZeRO stage 3's half-precision gathers (parallel/zero.h, parallel::GatheredParameters with a bf16
// compute dtype, as under CUDA autocast) on one process, under CPU autocast: every unit is
// gathered as a bf16 copy, the forward and backward run on it, and after the step the
// parameters are the fp32 masters again with fp32 gradients. The peer is what FSDP's mixed
// precision computes: the same model with bf16 parameters under the same autocast.
#include "catch.h"

#include <torch/torch.h>

#include "model_specs.h"
#include "sana/parallel/reducer.h"
#include "sana/distributed/runtime.h"
#include "sana/parallel/shard_plan.h"
#include "sana/model/sana_ms.h"
#include "sana/torch_compat.h"
#include "sana/parallel/zero.h"

using namespace sana;

namespace {

// CPU autocast to bf16 for its lifetime.
struct CpuAutocast {
  CpuAutocast() {
    compat::set_cpu_autocast_dtype(at::kBFloat16);
    compat::set_cpu_autocast(true);
  }
  ~CpuAutocast() {
    compat::set_cpu_autocast(false);
    at::autocast::clear_cache();
  }
};

// Records the dtype of one block parameter whenever the model announces a block.
struct Watch : model::BlockHooks {
  Watch(model::BlockHooks& inner, torch::Tensor probe) : inner_(inner), probe_(std::move(probe)) {}
  void forward_begins() override { inner_.forward_begins(); }
  void block_forward(int64_t block, bool begins) override {
    inner_.block_forward(block, begins);
    if (block == 0 && begins) seen.push_back(probe_.scalar_type());
  }
  void backward_reaches(int64_t block) override {
    inner_.backward_reaches(block);
    if (block == 0) seen.push_back(probe_.scalar_type());
  }
  void forward_ends(bool backward_follows) override { inner_.forward_ends(backward_follows); }
  std::vector<at::ScalarType> seen;
  model::BlockHooks& inner_;
  torch::Tensor probe_;
};

torch::Tensor loss_of(model::SanaMS& net, const torch::Tensor& x, const torch::Tensor& t, const model::Condition& c,
                      const torch::Tensor& target) {
  return (net->forward(x, t, c).to(torch::kFloat) - target).square().mean();
}

}  // namespace

TEST_CASE("stage 3 under bf16 autocast gathers bf16 copies and trains as FSDP's mixed precision", "[torch][zero]") {
  torch::manual_seed(3);
  auto spec = test::small_spec();
  spec.depth = 4;  // more than the two blocks a backward holds
  model::SanaMS net(spec), peer(spec);
  {
    torch::NoGradGuard no_grad;
    // Nothing zero (the zero-initialised projections would hide their inputs' gradients).
    for (auto& p : net->parameters()) p.add_(0.01 * torch::randn_like(p));
    const auto theirs = peer->named_parameters();
    for (const auto& item : net->named_parameters()) theirs[item.key()].copy_(item.value());
  }
  peer->to(at::kBFloat16);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  auto rt = dist::Runtime::start(dist::LaunchEnv{}, dist::RuntimeOptions{}, {"test", "test"});
  parallel::ReducerOptions opts;
  opts.bucket_cap_mb = 0.05;  // several buckets, so units span segments
  opts.first_bucket_mb = 0.01;
  opts.shard_gradients = true;  // the lazily bound gradient buckets of stage 2 and 3
  auto reducer = parallel::make_reducer(*rt, named, opts);
  auto flat = reducer->flatten_parameters();
  int64_t fp32_bytes = 0;
  for (const auto& b : flat) fp32_bytes += b.params.numel() * 4;
  parallel::GatheredParameters gathered(*rt, reducer->shard_plan(), flat, named, at::kBFloat16);
  const auto probe = net->named_parameters()["blocks.0.attn.qkv.weight"];
  Watch watch(gathered, probe);
  net->add_block_hooks(&watch);

  const auto x = torch::randn({2, spec.in_channels, 8, 8});
  const auto t = torch::tensor({300.0, 700.0});
  model::Condition cond;
  cond.y = torch::randn({2, spec.caption_tokens, spec.caption_channels});
  cond.mask = torch::ones({2, spec.caption_tokens}, torch::kInt64);
  const auto target = torch::randn_like(x);
  torch::Tensor mine, theirs;
  {
    CpuAutocast amp;
    reducer->begin_backward(true);
    mine = loss_of(net, x, t, cond, target);
    mine.backward();
    reducer->finalize();
    gathered.step_done();
    theirs = loss_of(peer, x, t, cond, target);
    theirs.backward();
  }
  net->remove_block_hooks(&watch);
  INFO("loss with bf16 gathers " << mine.item<double>() << ", with bf16 parameters " << theirs.item<double>());
  CHECK(mine.item<double>() == theirs.item<double>());
  // The forward and the backward saw block 0's weights as bf16; now they are fp32 again.
  CHECK(watch.seen == std::vector<at::ScalarType>{at::kBFloat16, at::kBFloat16});
  CHECK(probe.scalar_type() == at::kFloat);
  // Less than the whole model in bf16, and within the memory estimate's bound: the part
  // outside the blocks and two neighbouring blocks, at 2 bytes an element.
  std::vector<size_t> units;
  std::vector<parallel::GradBucket> layouts;
  for (const auto& [name, p] : named) units.push_back(parallel::gathering_unit(name));
  for (const auto& b : flat) layouts.push_back(b.layout);
  const int64_t bound = 2 * parallel::largest_gather(reducer->shard_plan(), layouts, units, 0, /*own_too=*/true);
  INFO("peak gathered " << gathered.peak_gathered() << " bytes; bound " << bound << "; whole model in bf16 "
                        << fp32_bytes / 2);
  CHECK(gathered.peak_gathered() > 0);
  CHECK(gathered.peak_gathered() <= bound);
  CHECK(bound < fp32_bytes / 2);
  // Gradients: fp32, in the reducer's buckets, the peer's bf16 ones (a parameter used
  // twice sums its two parts in fp32 here, in bf16 there: within bf16's precision).
  const auto peers = peer->named_parameters();
  double worst = 0;
  for (const auto& [name, p] : named) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().scalar_type() == at::kFloat);
    const auto want = peers[name].grad().to(at::kFloat);
    const double scale = want.abs().max().item<double>() + 1e-12;
    worst = std::max(worst, (p.grad() - want).abs().max().item<double>() / scale);
    CHECK(torch::equal(p.to(at::kBFloat16), peers[name]));  // the fp32 masters, untouched by the gathers
  }
  INFO("largest gradient difference, relative to the tensor's largest: " << worst);
  CHECK(worst < 4e-3);  // bf16's epsilon: 2^-8
}
