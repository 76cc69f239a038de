// A kind of training added from outside the loop (train/step/training_step.h): a test-only
// kind, registered here, runs under `sana-train`'s own train() on one process with neither
// the loop nor the Trainer knowing it. It trains flow matching on even steps and a scalar of
// its own toward 3 on odd steps (an own target: its reducer and optimizer), keeps a part in
// the checkpoints, and takes it back on a resume.
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "catch.h"
#include "sana/config/loader.h"
#include "sana/distributed/launch_env.h"
#include "sana/parallel/reducer.h"
#include "sana/train/previews/sampling.h"
#include "sana/train/step/training_step.h"
#include "sana/train/train.h"
#include "test_support.h"

using namespace sana;
using namespace sana::train;
namespace fs = std::filesystem;

namespace {

// What the test sees of the kind after its Trainer is gone.
struct Seen {
  std::vector<int64_t> steps;   // the global steps it ran
  double w = 0;                 // its scalar after the last of them
  int64_t restored_odd_steps = -1;
  double restored_w = 0;
  int64_t odd_steps() const {
    return static_cast<int64_t>(std::count_if(steps.begin(), steps.end(), [](int64_t s) { return s % 2; }));
  }
};

// Flow matching on even steps; on odd ones (w - 3)^2 of a scalar w of its own, the step's
// batch read and left unused.
class ScalarOnOddSteps : public TrainingStep, public Stateful {
 public:
  ScalarOnOddSteps(StepParts& parts, Seen& seen) : seen_(seen) {
    w_ = torch::zeros({1}, torch::requires_grad());
    NamedParams params{{"w", w_}};
    reducer_ = parallel::make_reducer(parts.rt, params);
    OptimizerOptions o;
    o.betas = {0.9, 0.999};
    optimizer_ = make_optimizer(o, params);
  }

  StepOutput run(TrainStep& micro, data::Loader& loader, const StepAt& at, BadSampleGuard& guard,
                 PhaseLosses& losses) override {
    seen_.steps.push_back(at.global_step);
    if (at.global_step % 2 == 0) return flow_.run(micro, loader, at, guard, losses);
    StepOutput out;
    micro.prepare(loader, at.epoch, at.step_in_epoch, guard, out);  // the step's samples, consumed
    reducer_->begin_backward(true);
    const auto loss = (w_ - 3.0).pow(2).sum();
    loss.backward();
    reducer_->finalize();
    out.loss_sum = loss.detach().to(torch::kFloat64);
    seen_.w = w_.item<double>();  // before this step's update: the one after is read at the next
    losses = {{"loss_w", loss.item<double>()}};
    return out;
  }
  std::optional<OwnTarget> own_target(int64_t global_step) override {
    if (global_step % 2 == 0) return std::nullopt;
    return OwnTarget{*reducer_, *optimizer_};
  }
  void zero_own_gradients() override { reducer_->zero_gradients(); }
  std::vector<Stateful*> parts() override { return {this}; }
  std::string describe() const override { return "test kind: a scalar toward 3 on odd steps"; }

  std::string state_name() const override { return "scalar_kind"; }
  PartState save_state() const override {
    return {nlohmann::json{{"odd_steps", seen_.odd_steps()}}, NamedTensors{{"w", w_.detach().clone()}}, {}};
  }
  void restore_state(const PartState* saved, const std::string& /*source*/) override {
    REQUIRE(saved != nullptr);
    seen_.restored_odd_steps = saved->json.at("odd_steps").get<int64_t>();
    torch::NoGradGuard no_grad;
    w_.copy_(PartState::tensors_of(saved).at(0).second);
    seen_.restored_w = w_.item<double>();
  }
  ~ScalarOnOddSteps() override { seen_.w = w_.item<double>(); }  // after the run's last update

 private:
  Seen& seen_;
  FlowMatchingStep flow_;
  torch::Tensor w_;
  std::unique_ptr<parallel::Reducer> reducer_;
  std::unique_ptr<Optimizer> optimizer_;
};

config::Config kind_run_config(const fs::path& root, int64_t max_steps) {
  const fs::path data = root / "data";
  if (!fs::exists(data)) {
    fs::create_directories(data);
    torch::manual_seed(0);
    for (int i = 0; i < 4; ++i) {
      write_grid_png(torch::rand({1, 3, 28, 28}) * 2 - 1, (data / fmt::format("img{}.png", i)).string(), 1);
    }
  }
  const fs::path yaml = root / "run.yaml";
  std::ofstream(yaml) << fmt::format(R"(work_dir: {}
data:
  data_dir: [{}]
  image_size: 32
  aspect_ratio_type: generated
  bucket_step: 8
model:
  model: SanaMS_tiny_P2_D4
  image_size: 32
  mixed_precision: fp32
vae:
  vae_type: none
text_encoder:
  text_encoder_name: none
train:
  seed: 1
  num_epochs: 100
  max_steps: {}
  global_batch_size: 2
  micro_batch_size: 2
  num_workers: 0
  visualize: false
  save_model_steps: 4
  auto_lr: none
  optimizer:
    type: AdamW
    lr: 0.1
dist:
  backend: gloo
)",
                                     (root / "work").string(), data.string(), max_steps);
  return config::load_config({yaml.string()}, {}, config::ValidationContext{1, false});
}

}  // namespace

TEST_CASE("A kind of training registered from outside runs under train() with its own target, part and resume",
          "[train][kind]") {
  test::TempDir dir;
  Seen seen;
  int made = 0;
  StepRegistration registration("scalar-on-odd-steps", [&](StepParts& parts) -> std::unique_ptr<TrainingStep> {
    ++made;
    return std::make_unique<ScalarOnOddSteps>(parts, seen);
  });
  REQUIRE(train::train(kind_run_config(dir.path(), 4), dist::LaunchEnv{}, TestHooks{}) == 0);
  CHECK(made == 1);
  CHECK(seen.steps == std::vector<int64_t>{0, 1, 2, 3});
  const double w_after_4 = seen.w;
  // Two AdamW steps at the peak rate, 0.1 (an own target has no schedule), from 0 toward 3
  // (steps 1 and 3): about 0.1 each.
  CHECK(w_after_4 > 0.15);
  CHECK(w_after_4 < 0.25);

  auto second = kind_run_config(dir.path(), 8);
  second.resume_from = "latest";
  seen = Seen{};
  REQUIRE(train::train(second, dist::LaunchEnv{}, TestHooks{}) == 0);
  CHECK(made == 2);
  CHECK(seen.restored_odd_steps == 2);  // its part came back from step 4's checkpoint
  CHECK(seen.restored_w == w_after_4);
  CHECK(seen.steps == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(seen.w > w_after_4 + 0.1);  // and trained on at steps 5 and 7
}

TEST_CASE("Without a registration the factory's own kinds run: the registered kind is gone with it", "[train][kind]") {
  test::TempDir dir;
  int made = 0;
  {
    StepRegistration registration("counting", [&made](StepParts&) -> std::unique_ptr<TrainingStep> {
      ++made;
      return nullptr;  // not this run's kind: the factory's flow matching runs
    });
    REQUIRE(train::train(kind_run_config(dir.path(), 2), dist::LaunchEnv{}, TestHooks{}) == 0);
    CHECK(made == 1);
  }
  auto again = kind_run_config(dir.path(), 4);
  again.resume_from = "latest";
  REQUIRE(train::train(again, dist::LaunchEnv{}, TestHooks{}) == 0);
  CHECK(made == 1);  // unregistered: not asked again
}
