// The trainer's parts on their own, without processes: the EMA's maths and its
// checkpoint round trip, the step agreement's packing and decisions, the non-finite
// policy, the save and preview policies, the resume compatibility check, and the
// Checkpointer writing, keeping and naming checkpoints.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "catch.h"
#include "sana/ckpt/checkpoint.h"
#include "sana/config/config.h"
#include "sana/train/checkpoint/checkpointer.h"
#include "sana/train/step/device_timeline.h"
#include "sana/train/optim/ema.h"
#include "sana/train/optim/loss_scaler.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/step/train_step.h"
#include "sana/train/report/metrics.h"
#include "sana/train/previews/previews.h"
#include "sana/train/checkpoint/resume.h"
#include "sana/train/elastic/share_mirror.h"
#include "sana/train/loop/step_agreement.h"
#include "sana/util/error.h"
#include "sana/util/log.h"
#include "test_support.h"

using namespace sana;
using namespace sana::train;
namespace fs = std::filesystem;

namespace {

std::vector<std::pair<std::string, torch::Tensor>> two_params() {
  return {{"a.weight", torch::tensor({1.0, 2.0})}, {"b.bias", torch::tensor({-4.0})}};
}

}  // namespace

TEST_CASE("Ema averages every parameter with the configured rate after each update", "[train][ema]") {
  auto params = two_params();
  Ema ema(params, 0.75);
  REQUIRE(ema.enabled());
  params[0].second.copy_(torch::tensor({5.0, 6.0}));
  params[1].second.copy_(torch::tensor({0.0}));
  ema.update();
  // 0.75 * old + 0.25 * new
  CHECK(ema.averages()[0][0].item<double>() == Approx(2.0));
  CHECK(ema.averages()[0][1].item<double>() == Approx(3.0));
  CHECK(ema.averages()[1][0].item<double>() == Approx(-3.0));
  ema.update();
  CHECK(ema.averages()[0][0].item<double>() == Approx(0.75 * 2.0 + 0.25 * 5.0));
}

TEST_CASE("Ema with an update interval moves on every N-th step only, by rate^N (train.ema_update_interval)",
          "[train][ema]") {
  auto params = two_params();
  Ema ema(params, 0.5, true, {}, EmaPlacement{/*host=*/true, /*interval=*/3, std::nullopt});
  CHECK(ema.on_host());
  CHECK(ema.averages()[0].device().is_cpu());
  params[0].second.copy_(torch::tensor({9.0, 10.0}));
  ema.update_at(1);
  ema.update_at(2);
  CHECK(ema.averages()[0][0].item<double>() == Approx(1.0));  // not yet
  ema.update_at(3);
  // 0.5^3 x 1 + (1 - 0.5^3) x 9
  CHECK(ema.averages()[0][0].item<double>() == Approx(0.125 * 1.0 + 0.875 * 9.0));
  CHECK(ema.averages()[0][1].item<double>() == Approx(0.125 * 2.0 + 0.875 * 10.0));
  ema.update_at(4);
  CHECK(ema.averages()[0][0].item<double>() == Approx(0.125 * 1.0 + 0.875 * 9.0));
  CHECK_THROWS_AS(Ema(two_params(), 0.5, true, {}, EmaPlacement{false, 0, std::nullopt}), std::invalid_argument);
}

TEST_CASE("Ema's checkpoint file carries the metadata it was given (diffusers' LoRA settings)", "[train][ema]") {
  Ema ema(two_params(), 0.5, true, {{"lora_adapter_metadata", "{}"}});
  CHECK(ema.save_state().metadata == std::map<std::string, std::string>{{"lora_adapter_metadata", "{}"}});
  Ema unsaved(two_params(), 0.5, false, {{"lora_adapter_metadata", "{}"}});  // ckpt.save_ema false: an empty file
  CHECK(unsaved.save_state().metadata.empty());
}

TEST_CASE("Ema with rate 0 is off and captures nothing", "[train][ema]") {
  Ema ema(two_params(), 0.0);
  CHECK_FALSE(ema.enabled());
  ema.update();
  CHECK(ema.named_averages().empty());
}

TEST_CASE("Ema restore_state is the inverse of save_state, and names what a checkpoint lacks", "[train][ema]") {
  auto params = two_params();
  Ema saved(params, 0.5);
  params[0].second.add_(10.0);
  saved.update();
  const PartState captured = saved.save_state();
  REQUIRE(captured.tensors);
  REQUIRE(captured.tensors->size() == 2);
  CHECK(captured.tensors->at(0).first == "a.weight");

  Ema resumed(two_params(), 0.5);
  resumed.restore_state(&captured, "ckpt/step_1");
  CHECK(torch::equal(resumed.averages()[0], saved.averages()[0]));

  Ema short_of_one(two_params(), 0.5);
  const PartState one{nullptr, NamedTensors{captured.tensors->at(0)}, {}};
  CHECK_THROWS_WITH(short_of_one.restore_state(&one, "ckpt/step_1"), Catch::Contains("'b.bias'"));

  // A checkpoint without EMA (ckpt.save_ema false): the average restarts from the weights now.
  auto now = two_params();
  Ema restarted(now, 0.5);
  now[1].second.fill_(7.0);
  const PartState none{nullptr, NamedTensors{}, {}};
  restarted.restore_state(&none, "ckpt/step_1");
  CHECK(restarted.averages()[1][0].item<double>() == 7.0);
}

TEST_CASE("The step agreement sums into one verdict that names who asked to stop", "[train][agreement]") {
  const int world = 3;
  std::vector<double> sums(6 + world, 0.0);
  // Rank 0 alone gives the whole gradient's squared norm: the sum is its figure exactly.
  const std::vector<LocalStep> ranks = {{1.0, 2.0, 1, 10, false, false, 4.0, 0.1 + 0.2},
                                        {2.0, 2.0, 0, 12, true, false, 0.0, 0.0},
                                        {3.0, 2.0, 2, 11, true, false, 5.0, 0.0}};
  for (int r = 0; r < world; ++r) {
    const auto v = pack_step(ranks[static_cast<size_t>(r)], r, world);
    REQUIRE(v.size() == sums.size());
    for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];
  }
  const auto verdict = decide_step(sums, world);
  CHECK_FALSE(verdict.nonfinite);
  CHECK(verdict.loss_mean == Approx(6.0));  // each rank's part is its share of the global mean
  CHECK(verdict.total_bad == 3);
  CHECK(verdict.total_reads == 33);
  CHECK(verdict.grad_square_sum == 9.0);  // ZeRO 2: the ranks' parts of the squared norm
  CHECK(verdict.grad_square_whole == 0.1 + 0.2);
  CHECK(verdict.stop_requested());
  CHECK(verdict.stop_ranks == std::vector<int>{1, 2});
}

TEST_CASE("One rank's non-finite loss or gradient norm makes the step non-finite everywhere", "[train][agreement]") {
  const auto finite = pack_step({1.0, 1.0, 0, 0, false}, 0, 2);
  auto bad = pack_step({1.0, std::numeric_limits<double>::infinity(), 0, 0, false}, 1, 2);
  std::vector<double> sums(finite.size());
  for (size_t i = 0; i < sums.size(); ++i) sums[i] = finite[i] + bad[i];
  CHECK(decide_step(sums, 2).nonfinite);
  CHECK_FALSE(decide_step(std::vector<double>(finite.size(), 0.0), 2).nonfinite);
  CHECK_FALSE(decide_step(std::vector<double>(finite.size(), 0.0), 2).stop_requested());
  CHECK_THROWS(decide_step(sums, 3));  // another world size's numbers
  CHECK_THROWS(pack_step({}, 2, 2));
}

TEST_CASE("Non-finite steps are skipped, counted, and too many in a row stop the run", "[train][agreement]") {
  NonfinitePolicy policy(2);
  CHECK(policy.accept(false, 1));
  CHECK_FALSE(policy.accept(true, 2));
  CHECK_FALSE(policy.accept(true, 3));
  CHECK(policy.accept(false, 4));  // a finite step resets the run of skips
  CHECK(policy.in_a_row() == 0);
  CHECK_FALSE(policy.accept(true, 5));
  CHECK_FALSE(policy.accept(true, 6));
  try {
    policy.accept(true, 7);
    FAIL("a third non-finite step in a row must stop the run");
  } catch (const Error& e) {
    CHECK(e.exit_code() == kExitFailure);
    CHECK_THAT(e.what(), Catch::Contains("train.max_nonfinite 2"));
  }
  CHECK(policy.skipped() == 5);
  NonfinitePolicy resumed(2);
  const auto saved = policy.save_state();
  resumed.restore_state(&saved, "ckpt/step_7");
  CHECK(resumed.skipped() == 5);
}

TEST_CASE("The save policy: every N steps, every N epochs, on a stop request, at the end", "[train][checkpointer]") {
  CheckpointOptions t;
  t.save_model_steps = 5;
  t.save_model_epochs = 2;
  CHECK(save_reason(t, 10, 100, false, 0, false) == "train.save_model_steps");
  CHECK(save_reason(t, 7, 100, false, 0, false).empty());
  CHECK(save_reason(t, 7, 100, true, 0, false).empty());  // epoch 1 of every 2
  CHECK(save_reason(t, 7, 100, true, 1, false) == "train.save_model_epochs");
  CHECK(save_reason(t, 7, 100, false, 0, true) == "stop request");
  CHECK(save_reason(t, 99, 99, false, 0, false) == "end of training");
  t.save_model_steps = 0;
  t.save_model_epochs = 0;
  CHECK(save_reason(t, 10, 100, true, 1, false).empty());
}

TEST_CASE("The preview policy: every N steps or N epochs, never at the last step", "[train][previews]") {
  PreviewPolicy t;
  t.visualize = true;
  t.eval_sampling_steps = 4;
  t.preview_every_epochs = 0;
  CHECK(preview_reason(t, 8, 20, false, 0) == "train.eval_sampling_steps");
  CHECK(preview_reason(t, 9, 20, false, 0).empty());
  CHECK(preview_reason(t, 20, 20, false, 0).empty());  // the end of training renders on its own
  t.eval_sampling_steps = 0;
  t.preview_every_epochs = 2;
  CHECK(preview_reason(t, 9, 20, true, 1) == "end of epoch 2");
  CHECK(preview_reason(t, 9, 20, true, 0).empty());
  t.visualize = false;
  CHECK(preview_reason(t, 9, 20, true, 1).empty());
}

TEST_CASE("A checkpoint of another seed or model is refused as a config error, another batch is not", "[train][resume]") {
  config::Config cfg;
  cfg.train.global_batch_size = 8;
  cfg.train.seed = 3;
  cfg.model.model = "SanaMS_tiny";
  ResumeOptions o = resume_options_for(cfg, "SanaMS_tiny");
  ckpt::TrainerState saved;
  saved.global_batch_size = 8;
  saved.seed = 3;
  saved.model = "SanaMS_tiny";
  CHECK_NOTHROW(check_resumable(saved, o, "ckpt/step_1"));
  saved.seed = 4;
  try {
    check_resumable(saved, o, "ckpt/step_1");
    FAIL("another seed must be refused");
  } catch (const Error& e) {
    CHECK(e.exit_code() == kExitUsage);
    CHECK_THAT(e.what(), Catch::Contains("train.seed 4") && Catch::Contains("ckpt/step_1"));
  }
  saved.seed = 3;
  CHECK_THROWS_AS(check_resumable(saved, resume_options_for(cfg, "SanaMS_other"), "ckpt/step_1"), UsageError);
  // Another global batch (upstream's batch style on another world size, or by hand): the
  // trainer re-batches the rest of the epoch.
  cfg.train.train_batch_size = 4;
  cfg.train.global_batch_size = 12;  // 4 x 1 x 3 processes
  CHECK_NOTHROW(check_resumable(saved, resume_options_for(cfg, "SanaMS_tiny"), "ckpt/step_1"));
}

namespace {

// A stateful part as a new feature would add one: a counter (JSON) and a tensor.
class Counter : public Stateful {
 public:
  int64_t count = 0;
  torch::Tensor values = torch::zeros({3});
  std::string state_name() const override { return "counter"; }
  PartState save_state() const override { return {{{"count", count}}, NamedTensors{{"values", values.clone()}}, {}}; }
  void restore_state(const PartState* saved, const std::string& source) override {
    if (saved == nullptr) throw std::runtime_error("no counter in " + source);
    count = saved->json.at("count");
    values = saved->tensors->at(0).second.clone();
  }
};

}  // namespace

TEST_CASE("A registered stateful part round-trips through a checkpoint save and resume", "[train][checkpointer]") {
  test::TempDir dir;
  config::Config cfg;
  cfg.work_dir = dir.path();
  cfg.ckpt.async_save = true;
  Counter before;
  before.count = 42;
  before.values = torch::tensor({1.5, -2.0, 3.25}, torch::kFloat32);
  Checkpointer writer(checkpoint_options_for(cfg), /*writes=*/true);
  writer.add(before);
  CHECK_THROWS_WITH(writer.add(before), Catch::Contains("two stateful parts are named 'counter'"));
  writer.save({0, 5, 5}, "test", [] {
    ckpt::TrainerState run;
    run.position.global_step = 5;
    return run;
  });
  writer.finish();
  before.count = 0;  // what a resume must not see

  const auto latest = ckpt::resolve_latest(dir.path());
  REQUIRE(latest.warnings.empty());
  CHECK(fs::exists(fs::path(latest.path) / "counter.safetensors"));
  auto snapshot = ckpt::read_checkpoint(latest.path);
  CHECK(snapshot.state.position.global_step == 5);
  Counter after;
  Checkpointer reader(checkpoint_options_for(cfg), /*writes=*/false);
  reader.add(after);
  reader.restore(snapshot, latest.path);
  CHECK(after.count == 42);
  CHECK(torch::equal(after.values, torch::tensor({1.5, -2.0, 3.25}, torch::kFloat32)));
  // A checkpoint from before the part existed hands it nothing.
  ckpt::Snapshot older;
  CHECK_THROWS_WITH(reader.restore(older, "ckpt/step_1"), Catch::Contains("no counter in ckpt/step_1"));
}

namespace {

// A part named "model" holding one tensor `w`.
class Weights : public Stateful {
 public:
  torch::Tensor w = torch::zeros({2});
  std::string state_name() const override { return "model"; }
  PartState save_state() const override { return {nullptr, NamedTensors{{"w", w.clone()}}, {}}; }
  void restore_state(const PartState*, const std::string&) override {}
};

}  // namespace

TEST_CASE("The Checkpointer saves by policy, once per step, keeps the newest and moves latest", "[train][checkpointer]") {
  test::TempDir dir;
  config::Config cfg;
  cfg.work_dir = dir.path();
  cfg.train.save_model_steps = 2;
  cfg.ckpt.keep_last_n = 2;
  cfg.ckpt.async_save = true;
  int captures = 0;
  int64_t step = 0;
  Weights weights;
  const auto capture = [&] {
    ++captures;
    weights.w = torch::full({2}, static_cast<double>(step));
    ckpt::TrainerState s;
    s.position.global_step = step;
    s.global_batch_size = 8;
    return s;
  };
  {
    Checkpointer writer(checkpoint_options_for(cfg), /*writes=*/true);
    writer.add(weights);
    for (step = 1; step <= 7; ++step) {
      RunPosition next{0, step, step};
      writer.maybe_save(next, 7, false, 0, false, capture);
      writer.maybe_save(next, 7, false, 0, false, capture);  // the same step again: no second write
    }
    writer.finish();
  }
  CHECK(captures == 4);  // steps 2, 4, 6 and 7 (the end)
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(fs::path(dir.path()) / "checkpoints")) {
    if (e.is_directory()) kept.push_back(e.path().filename().string());
  }
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>{ckpt::checkpoint_name(6), ckpt::checkpoint_name(7)});
  const auto latest = ckpt::resolve_latest(dir.path());
  CHECK(fs::path(latest.path).filename() == ckpt::checkpoint_name(7));
  const auto state = ckpt::verify_checkpoint(latest.path);
  CHECK(state.position.global_step == 7);

  // Ranks that do not write follow the same policy but never capture.
  int other_captures = 0;
  Checkpointer follower(checkpoint_options_for(cfg), /*writes=*/false);
  follower.maybe_save({0, 2, 2}, 7, false, 0, false, [&] {
    ++other_captures;
    return ckpt::TrainerState{};
  });
  follower.finish();
  CHECK(other_captures == 0);
}

TEST_CASE("Durations read as minutes or hours", "[train][metrics]") {
  CHECK(duration_text(65) == "1m05s");
  CHECK(duration_text(7380) == "2h03m");
  CHECK(duration_text(-1) == "?");
}

TEST_CASE("The log line's means cover every step since the last line, across epochs shorter than it",
          "[train][metrics]") {
  test::TempDir dir;
  std::string error;
  REQUIRE(log::open_file(dir.path("train.log"), &error));
  MetricsOptions o;
  o.work_dir = dir.path();
  o.log_interval = 6;
  {
    Metrics metrics(o, true, 6, false);
    // Epochs of 2 steps (a small dataset): each starts a loader whose data-wait clock starts
    // at 0, and each loader waited 1 s per step. Alternating steps have a loss, as a
    // SANA-Sprint run's generator steps; every step has its phase's figure.
    for (int64_t step = 0; step < 6; ++step) {
      if (step % 2 == 0) metrics.new_loader(0.0);
      StepRecord r;
      r.global_step = step + 1;
      r.epoch = step / 2;
      r.has_loss = step % 2 == 0;
      r.loss = static_cast<double>(step + 1);     // losses 1, 3, 5: their mean 3
      r.grad_norm = 1.0;
      r.samples = 4;                               // 24 samples in the interval
      r.figures = {{step % 2 == 0 ? "loss_G" : "loss_D", static_cast<double>(step)}};  // G 0, 2, 4; D 1, 3, 5
      metrics.record(r, StepTimes{}, static_cast<double>(step % 2 + 1), false);
    }
    metrics.finish(6, 0, false);
  }
  log::close_file();
  std::ifstream in(dir.path("train.log"));
  std::string line, text;
  while (std::getline(in, line)) {
    if (line.find("step 6/6") != std::string::npos) text = line;
  }
  INFO(text);
  CHECK(text.find("loss 3.0000 loss_G 2.0000 loss_D 3.0000") != std::string::npos);
}

TEST_CASE("fp16 loss scaling: skip and halve on overflow, grow after 2000 clean steps", "[train][amp]") {
  train::LossScaler off(false);
  CHECK(off.scale() == 1.0);
  CHECK_FALSE(off.update(false));
  CHECK(off.overflows() == 0);

  train::LossScaler s(true);
  CHECK(s.scale() == 65536.0);  // torch's GradScaler defaults, as upstream's accelerate uses them
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 32768.0);
  CHECK(s.overflows() == 1);
  for (int i = 0; i < 1999; ++i) CHECK(s.update(true));
  CHECK(s.scale() == 32768.0);
  CHECK(s.update(true));  // the 2000th clean step in a row
  CHECK(s.scale() == 65536.0);
  for (int i = 0; i < 1500; ++i) s.update(true);
  CHECK_FALSE(s.update(false));  // an overflow restarts the count
  for (int i = 0; i < 1999; ++i) s.update(true);
  CHECK(s.scale() == 32768.0);
  // Checkpointed: a restored scaler continues exactly.
  train::LossScaler back(true);
  const auto saved = s.save_state();
  back.restore_state(&saved, "ckpt/step_5500");
  CHECK(back.scale() == s.scale());
  CHECK(back.update(true) == s.update(true));
  CHECK(back.scale() == 65536.0);
  CHECK(back.scale() == s.scale());
  CHECK(back.overflows() == 2);

  // Only fp16 autocast scales (CUDA); bf16, fp32 and CPU runs do not.
  CHECK(train::loss_scaling(torch::Device(torch::kCUDA, 0), train::half_type(config::Precision::fp16)));
  CHECK_FALSE(train::loss_scaling(torch::Device(torch::kCUDA, 0), train::half_type(config::Precision::bf16)));
  CHECK_FALSE(train::loss_scaling(torch::Device(torch::kCPU), train::half_type(config::Precision::fp16)));
}

TEST_CASE("the gradient norm, accumulated in float64 without a float64 copy, is float64's to 1e-11", "[train][amp]") {
  // Before: every bucket copied to float64 and its squares summed there. Buckets of the
  // sizes the reducer makes (up to 25 M elements), gradients spanning 8 decades; and the
  // same elements split into other buckets (ZeRO's segments) give the same norm.
  torch::manual_seed(13);
  std::vector<torch::Tensor> grads;
  double expected = 0;
  for (const int64_t n : {int64_t{7}, int64_t{100000}, int64_t{25} << 20}) {
    grads.push_back(torch::randn({n}) * torch::pow(10.0, torch::rand({n}) * 8 - 6));
    const auto wide = grads.back().to(torch::kFloat64);
    expected += wide.dot(wide).item<double>();
  }
  const auto loss = torch::tensor(0.125, torch::kFloat64);
  // The step reads {square, loss} once, with the agreement (trainer.cpp).
  const auto norm_and_loss = [](const std::vector<torch::Tensor>& g, const torch::Tensor& l) {
    const auto t = train::grad_square_and_loss(g, l);
    REQUIRE(t.scalar_type() == torch::kFloat64);
    REQUIRE(t.sizes() == torch::IntArrayRef{2});
    return std::pair<double, double>{std::sqrt(t[0].item<double>()), t[1].item<double>()};
  };
  const auto [norm, read_loss] = norm_and_loss(grads, loss);
  CHECK(std::abs(norm - std::sqrt(expected)) <= 1e-11 * std::sqrt(expected));
  CHECK(read_loss == 0.125);
  // Bit for bit what the host computed before the sum moved to the device: each bucket's
  // float64 norm squared, read, and summed in the buckets' order.
  double host = 0;
  for (const auto& g : grads) {
    const auto n = at::linalg_vector_norm(g, 2, {}, false, torch::kFloat64);
    host += (n * n).item<double>();
  }
  CHECK(norm == std::sqrt(host));
  const auto all = torch::cat(grads);
  const int64_t cut = all.numel() / 3 + 5;
  const auto [resplit, unused] = norm_and_loss({all.narrow(0, 0, cut), all.narrow(0, cut, all.numel() - cut)}, loss);
  CHECK(std::abs(resplit - norm) <= 1e-11 * norm);
  // A non-finite gradient gives a non-finite norm (the step's verdict skips it).
  grads[1][5] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(std::isfinite(norm_and_loss(grads, loss).first));
  grads[1][5] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(norm_and_loss(grads, loss).first));
  // No gradients (nothing trains on this rank's share): a zero norm.
  CHECK(norm_and_loss({}, loss).first == 0.0);
}

TEST_CASE("scaled gradients are unscaled, then clipped by their true norm", "[train][amp]") {
  const auto g = torch::tensor({3.0, 4.0}, torch::kFloat64);  // norm 5
  auto grad = g * 1024.0;
  train::unscale_and_clip({grad}, 5.0, 1024.0, 0.0);
  CHECK(torch::allclose(grad, g, 0, 1e-12));
  grad = g * 1024.0;
  train::unscale_and_clip({grad}, 5.0, 1024.0, 1.0);  // clipped to norm 1, as clip_grad_norm_
  CHECK(torch::allclose(grad, g / (5.0 + 1e-6), 0, 1e-12));
  grad = g.clone();
  train::unscale_and_clip({grad}, 5.0, 1.0, 10.0);  // nothing to do
  CHECK(torch::equal(grad, g));
}

TEST_CASE("share mirrors go to another node where the group spans several (mirror_stride)", "[train][elastic]") {
  using sana::train::mirror_stride;
  // One node: the next rank, as before.
  CHECK(mirror_stride({"a", "a", "a", "a"}) == 1);
  // Two nodes of two, numbered node by node: two on, every mirror across.
  CHECK(mirror_stride({"node 0", "node 0", "node 1", "node 1"}) == 2);
  CHECK(mirror_stride({"x", "x", "x", "y", "y", "y"}) == 3);
  // Nodes taking turns: the next rank is already across.
  CHECK(mirror_stride({"a", "b", "a", "b"}) == 1);
  // After a loss the nodes are uneven: the stride with the most mirrors across (2 of 3).
  const std::vector<std::string> uneven{"a", "b", "b"};
  const int s = mirror_stride(uneven);
  int across = 0;
  for (int r = 0; r < 3; ++r) across += uneven[static_cast<size_t>(r)] != uneven[static_cast<size_t>((r + s) % 3)];
  CHECK(across == 2);
  CHECK(mirror_stride({"a", "b"}) == 1);
}

namespace {

// The device's clock in a test: marks at a time the test sets, passed once the test says so.
class SetClock : public train::DeviceTimeline::Clock {
 public:
  explicit SetClock(double& now, int& passed_up_to) : now_(now), passed_(passed_up_to) {}
  int mark() override {
    at_.push_back(now_);
    return static_cast<int>(at_.size()) - 1;
  }
  bool passed(int id) override { return id <= passed_; }
  double seconds(int from, int to) override { return at_.at(static_cast<size_t>(to)) - at_.at(static_cast<size_t>(from)); }
  void release(int) override { ++released; }
  int released = 0;

 private:
  double& now_;
  int& passed_;
  std::vector<double> at_;
};

}  // namespace

TEST_CASE("The device timeline gives each span between marks to the phase it opened", "[train][timeline]") {
  using train::StepTimes;
  double now = 0;
  int passed = -1;
  auto owned = std::make_unique<SetClock>(now, passed);
  auto* clock = owned.get();
  train::DeviceTimeline timeline(std::move(owned));
  {
    const train::DeviceTimeline::Active active(timeline);
    // Step 1, as the step's timers run: forward+backward paused for the encoders and the
    // data, the held-out loss unmarked inside checkpoint/preview.
    train::StepTimes host;
    {
      train::PhaseTimer compute(host, &StepTimes::forward_backward);  // t = 0
      now = 2;
      compute.pause();
      {
        train::PhaseTimer encoding(host, &StepTimes::encoders);
        now = 3;
      }
      {
        train::PhaseTimer waiting(host, &StepTimes::data);
        now = 3.5;
      }
      compute.resume();
      now = 6.5;
    }
    {
      train::PhaseTimer saving(host, &StepTimes::checkpoint_preview);
      const train::NoPhaseMarks unmarked;
      train::PhaseTimer eval(host, &StepTimes::forward_backward);
      now = 7.5;
    }
    now = 8;  // bookkeeping: no phase
    timeline.end_step(1);
    CHECK(timeline.take_finished().empty());  // the device is not past the end yet
    // Step 2 begins at step 1's end; the optimizer's span.
    {
      train::PhaseTimer update(host, &StepTimes::optimizer);
      now = 9;
    }
    now = 10;
    timeline.end_step(2);
  }
  CHECK(train::PhaseMarks::current() == nullptr);  // Active restores the thread's (none)
  passed = 100;
  const auto done = timeline.take_finished();
  REQUIRE(done.size() == 2);
  CHECK(done[0].step == 1);
  CHECK(done[0].times.forward_backward == 2 + 3);
  CHECK(done[0].times.encoders == 1);
  CHECK(done[0].times.data == 0.5);
  CHECK(done[0].times.checkpoint_preview == 1);  // the unmarked loss counted there
  CHECK(done[0].times.total == 8);
  CHECK(done[0].times.other() == 0.5);
  CHECK(done[1].step == 2);
  CHECK(done[1].times.optimizer == 1);
  CHECK(done[1].times.total == 2);  // from step 1's end
  CHECK(done[1].times.other() == 1);
  CHECK(timeline.take_finished().empty());  // handed over once
  CHECK(clock->released > 0);  // marks go back to the clock's pool
  // A timer outside an Active scope marks nothing.
  train::StepTimes host;
  { train::PhaseTimer alone(host, &StepTimes::data); }
  timeline.end_step(3);
  const auto third = timeline.take_finished();
  REQUIRE(third.size() == 1);
  CHECK(third[0].times.data == 0);
}

TEST_CASE("The run state round-trips through a checkpoint's state, and a new batch starts a segment mid-epoch",
          "[train][checkpointer]") {
  RunState run(data::BatchSpec{8, 0});
  run.advance(0, 0, false, 8);
  run.advance(0, 1, false, 8);
  CHECK(run.position().epoch == 0);
  CHECK(run.position().step_in_epoch == 2);
  CHECK(run.position().global_step == 2);
  CHECK(run.position().consumed_samples == 16);
  ckpt::TrainerState identity;
  identity.seed = 3;
  const auto saved = run.saved(identity);
  CHECK(saved.seed == 3);
  CHECK(saved.global_batch_size == 8);
  CHECK(saved.epoch_segments.empty());  // one way of batching: no segments kept

  // The same batch: nothing to re-batch; the position is the saved one.
  RunState same(data::BatchSpec{8, 0});
  CHECK_FALSE(same.continue_at(saved));
  CHECK(same.resumed());
  CHECK(same.position().global_step == 2);
  CHECK(same.position().consumed_samples == 16);

  // Another batch mid-epoch: the rest of the epoch is a segment of its own, kept by the
  // next checkpoint and read back by the resume after it.
  RunState other(data::BatchSpec{4, 0});
  CHECK(other.continue_at(saved));
  other.rebatch();
  REQUIRE(other.segments().size() == 2);
  CHECK(other.segments()[0].batch.global_batch == 8);
  CHECK(other.segments()[1].first_step == 2);
  CHECK(other.segments()[1].batch.global_batch == 4);
  other.advance(0, 2, false, 4);
  const auto again = other.saved({});
  REQUIRE(again.epoch_segments.size() == 2);
  RunState third(data::BatchSpec{4, 0});
  CHECK_FALSE(third.continue_at(again));
  CHECK(third.segments().size() == 2);
  CHECK(third.segments()[1].first_step == 2);
  // The epoch's end: the next epoch is batched as the run is, in one segment.
  third.advance(0, 5, true, 4);
  CHECK(third.position().epoch == 1);
  CHECK(third.position().step_in_epoch == 0);
  CHECK(third.segments().size() == 1);
  CHECK(third.saved({}).epoch_segments.empty());
}
