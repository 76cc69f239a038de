// `sana-train model`'s memory estimate: its activations, scaled from four small forwards to
// the config's depth, largest bucket and micro-batch, agree with one forward measured at
// exactly that size (unconditional and caption-conditioned, where the caption's tokens are
// a per-sample cost that does not grow with the image); gradient checkpointing keeps less;
// the optimizer state follows the optimizer (AdamW two moments, CAME factored).
#include "catch.h"

#include <algorithm>

#include "sana/config/config.h"
#include "sana/config/loader.h"
#include "sana/model/frozen_storage.h"
#include "sana/model/ladd_heads.h"
#include "sana/model/sana_ms.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/options/torch_options.h"
#include "sana/model/spec.h"
#include "sana/train/options/core_options.h"
#include "sana/train/report/memory_estimate.h"
#include "sana/train/report/micro_batch.h"

using namespace sana;

namespace {

config::Config tiny_config() {
  config::Config cfg;
  cfg.model.model = "SanaMS_tiny_P2_D4";
  cfg.model.mixed_precision = config::Precision::fp32;
  cfg.data.image_size = 64;
  cfg.data.aspect_ratio_type = "generated";
  cfg.data.bucket_step = 8;
  cfg.model.image_size = 64;
  cfg.train.micro_batch_size = 3;
  cfg.train.global_batch_size = 6;
  return cfg;
}

// The estimate against a forward measured at the config's own size.
void check_against_measurement(const config::Config& cfg) {
  const auto e = train::estimate_memory(train::memory_estimate_options_for(cfg));
  const auto spec = train::model_spec_for(cfg);
  const int64_t cell = spec.downsample * spec.patch;
  REQUIRE(e.tokens == (e.height / cell) * (e.width / cell));
  REQUIRE(e.tokens > 128);  // beyond the token counts the estimate measured at
  const double measured =
      train::step_peak_bytes(spec, spec.depth, e.height / cell, e.width / cell, e.micro_batch, 0);
  INFO("estimate " << e.activations << " bytes, measured " << measured << " at " << e.height << "x" << e.width
                   << " x " << e.micro_batch);
  CHECK(e.activations == Approx(measured).epsilon(0.10));
  const double kept = train::step_peak_bytes(spec, spec.depth, e.height / cell, e.width / cell, e.micro_batch, 1);
  // The recompute's block included; extrapolated from 64 and 128 tokens, where the
  // per-sample terms dominate (the caption case: 15% under at 4480 tokens).
  CHECK(e.activations_checkpointed == Approx(kept).epsilon(0.20));
  CHECK(e.activations_checkpointed < 0.75 * e.activations);
}

}  // namespace

TEST_CASE("the activation estimate matches a forward measured at the largest bucket", "[train][memory]") {
  auto cfg = tiny_config();
  check_against_measurement(cfg);
  const auto e = train::estimate_memory(train::memory_estimate_options_for(cfg));
  // The reducer's flat buckets: every parameter's fp32, plus at most 60 bytes of alignment each.
  CHECK(e.weights >= 4.0 * static_cast<double>(e.parameters));
  CHECK(e.weights < 4.0 * static_cast<double>(e.parameters) + 60.0 * 200);
  CHECK(e.optimizer > 2 * e.weights);  // AdamW's two moments in the same buckets, and step counts
  CHECK(e.optimizer < 2 * e.weights + 8.0 * 200);
  CHECK(e.total() == Approx(e.weights + e.gradients + e.optimizer + e.activations));
}

TEST_CASE("caption tokens are a per-sample cost in the estimate", "[train][memory]") {
  auto cfg = tiny_config();
  cfg.data.load_text_feat = true;  // caption-conditioned: 300 caption tokens of 64 features
  cfg.text_encoder.caption_channels = 64;
  cfg.text_encoder.model_max_length = 300;
  REQUIRE(train::model_spec_for(cfg).conditioning == model::Conditioning::caption);
  check_against_measurement(cfg);
}

TEST_CASE("CAME keeps less state than AdamW, EMA adds a copy, the config's checkpointing is used", "[train][memory]") {
  auto cfg = tiny_config();
  cfg.train.optimizer.type = config::OptimizerType::CAME;
  cfg.train.ema_update = true;
  cfg.train.grad_checkpointing = true;
  const auto e = train::estimate_memory(train::memory_estimate_options_for(cfg));
  CHECK(e.optimizer_name == "CAME");
  CHECK(e.optimizer < 2 * e.weights);
  CHECK(e.optimizer > e.weights);  // the first moment is kept whole
  CHECK(e.ema == Approx(e.weights));
  CHECK(e.activations_for_config() == Approx(e.activations_checkpointed));
}

// AdamW's flat moments are checked end to end (tests/apps/memory_report.sh): its buckets come
// from the reducer.
TEST_CASE("the optimizer state estimate is the bytes each optimizer keeps, 8-bit included", "[train][memory]") {
  using config::OptimizerType;
  for (const auto type : {OptimizerType::CAME, OptimizerType::CAME8bit, OptimizerType::AdamW8bit, OptimizerType::Lion,
                          OptimizerType::Adafactor, OptimizerType::Prodigy, OptimizerType::ScheduleFreeAdamW}) {
    auto cfg = tiny_config();
    cfg.train.optimizer.type = type;
    cfg.train.optimizer.min_8bit_size = 1000;  // the tiny model's larger weights go 8-bit
    cfg.train.optimizer.block_size = 48;
    cfg.train.optimizer.betas.clear();  // the optimizer's own
    cfg.train.optimizer.eps.clear();
    config::resolve_defaults(cfg);
    const auto e = train::estimate_memory(train::memory_estimate_options_for(cfg));
    model::SanaMS m(train::model_spec_for(cfg));
    train::NamedParams params;
    for (const auto& item : m->named_parameters()) params.emplace_back(item.key(), item.value());
    auto opt = train::make_optimizer(train::optimizer_options_for(cfg), params);
    for (auto& [name, p] : params) p.mutable_grad() = torch::randn(p.sizes());
    opt->step(1e-4);
    double kept = 0;
    for (const auto& [name, t] : opt->state()) kept += static_cast<double>(t.nbytes());
    INFO(config::name_of(type));
    CHECK(e.optimizer == kept);
  }
  auto cfg = tiny_config();
  cfg.train.optimizer.type = config::OptimizerType::CAME8bit;
  cfg.train.optimizer.min_8bit_size = 1000;
  const double eight = train::estimate_memory(train::memory_estimate_options_for(cfg)).optimizer;
  cfg.train.optimizer.type = config::OptimizerType::CAME;
  CHECK(eight < 0.5 * train::estimate_memory(train::memory_estimate_options_for(cfg)).optimizer);
  // AdamW8bit: about a quarter of AdamW's 8 bytes an element.
  cfg.train.optimizer.type = config::OptimizerType::AdamW8bit;
  const double adamw8 = train::estimate_memory(train::memory_estimate_options_for(cfg)).optimizer;
  cfg.train.optimizer.type = config::OptimizerType::AdamW;
  CHECK(adamw8 < 0.3 * train::estimate_memory(train::memory_estimate_options_for(cfg)).optimizer);
}

TEST_CASE("train.gc_step: checkpointing every other block keeps what the estimate says", "[train][memory]") {
  auto cfg = tiny_config();
  cfg.train.grad_checkpointing = true;
  cfg.train.micro_batch_size = 2;
  const auto every_block = train::estimate_memory(train::memory_estimate_options_for(cfg));
  cfg.train.gc_step = 2;
  const auto every_other = train::estimate_memory(train::memory_estimate_options_for(cfg));
  CHECK(every_other.activations_checkpointed > every_block.activations_checkpointed);
  CHECK(every_other.activations_checkpointed < every_other.activations);
  const auto spec = train::model_spec_for(cfg);
  const int64_t cell = spec.downsample * spec.patch;
  const auto e = every_other;
  const double measured = train::step_peak_bytes(spec, spec.depth, e.height / cell, e.width / cell, e.micro_batch, 2);
  const double all = train::step_peak_bytes(spec, spec.depth, e.height / cell, e.width / cell, e.micro_batch, 1);
  INFO("every other block: estimate " << e.activations_checkpointed << " bytes, measured over the forward and "
       << "backward " << measured << " (every block " << all << ")");
  CHECK(measured > all);
  // An upper bound: the sum of the checkpointed blocks' peak and the other blocks'
  // activations, which the backward frees before it recomputes the first blocks.
  CHECK(measured < e.activations_checkpointed);
  CHECK(e.activations_checkpointed < 1.5 * measured);
}

TEST_CASE("SANA-Sprint's stage 2: the teacher and the heads in the estimate are the bytes they hold", "[train][memory]") {
  auto cfg = tiny_config();
  cfg.model.model = "SanaMSCM_tiny_P2_D4";
  cfg.model.sprint.teacher_model = "teacher.safetensors";  // a stage-2 run; nothing is read
  cfg.model.sprint.head_block_ids = {1, 3};
  cfg.train.optimizer.type = config::OptimizerType::CAME;
  cfg.train.optimizer.betas.clear();
  cfg.train.optimizer.eps.clear();
  cfg.train.frozen_base_dtype = config::FrozenDtype::bf16;
  config::resolve_defaults(cfg);
  const auto e = train::estimate_memory(train::memory_estimate_options_for(cfg), 1, /*activations=*/false);
  // The teacher, built for real with its layers stored in bf16.
  model::SanaMS teacher(train::teacher_spec_for(cfg));
  for (auto& p : teacher->parameters()) p.requires_grad_(false);
  model::store_frozen_layers(*teacher, model::StorageDtype::bf16, [](const std::string&) { return true; });
  double held = 0;
  for (const auto& p : teacher->parameters()) held += static_cast<double>(p.nbytes());
  CHECK(e.teacher == held);
  CHECK(e.teacher_parameters == teacher->parameter_count());
  // The heads, built for real, after one CAME step: weights, gradients and the state.
  model::LaddHeads heads(teacher->spec().hidden, 2, 0);
  train::NamedParams params;
  double weights = 0;
  for (const auto& item : heads->named_parameters()) {
    params.emplace_back(item.key(), item.value());
    weights += static_cast<double>(item.value().nbytes());
  }
  auto opt = train::make_optimizer(train::optimizer_options_for(cfg), params);
  for (auto& [name, p] : params) p.mutable_grad() = torch::randn(p.sizes());
  opt->step(1e-4);
  double state = 0;
  for (const auto& [name, t] : opt->state()) state += static_cast<double>(t.nbytes());
  CHECK(e.heads_parameters == model::ladd_heads_parameters(teacher->spec().hidden, 2));
  // The gradient buckets align each parameter to 64 bytes: a few hundred bytes over.
  CHECK(e.heads == Approx(2 * weights + state).epsilon(0.001));
  CHECK(e.total() > e.weights + e.teacher + e.heads);
}

TEST_CASE("SANA-Sprint's stage 2: the activation estimate matches its steps measured at the largest bucket",
          "[train][memory]") {
  // The x0 prediction from the sCM forward and heads on blocks 1 and 3 (the teacher's graph
  // through all 4 blocks), or a second student forward and a head on block 1 only.
  for (const bool largest : {false, true}) {
    INFO("train.train_largest_timestep " << largest);
    auto cfg = tiny_config();
    cfg.model.model = "SanaMSCM_tiny_P2_D4";
    cfg.model.sprint.teacher_model = "teacher.safetensors";  // a stage-2 run; nothing is read
    cfg.model.sprint.head_block_ids = largest ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 3};
    cfg.train.sprint.train_largest_timestep = largest;
    config::resolve_defaults(cfg);
    const auto options = train::memory_estimate_options_for(cfg);
    REQUIRE(options.sprint);
    const auto e = train::estimate_memory(options);
    const auto spec = train::model_spec_for(cfg);
    const int64_t cell = spec.downsample * spec.patch, h = e.height / cell, w = e.width / cell;
    REQUIRE(e.tokens > 128);
    // A generator and a discriminator step run whole: every block, the config's heads, bucket
    // and micro-batch.
    const double measured = train::sprint_step_peak_bytes(spec, *options.sprint, spec.depth, h, w, e.micro_batch, 0);
    const double kept = train::sprint_step_peak_bytes(spec, *options.sprint, spec.depth, h, w, e.micro_batch, 1);
    INFO("estimate " << e.activations << " bytes, measured " << measured << "; checkpointed " << e.activations_checkpointed
                     << ", measured " << kept << "; at " << e.height << "x" << e.width << " x " << e.micro_batch);
    CHECK(e.activations == Approx(measured).epsilon(0.15));
    CHECK(e.activations_checkpointed == Approx(kept).epsilon(0.15));
    // The student's graph and the teacher's at once (with train_largest_timestep a second
    // student graph): well over a flow step's.
    auto flow = options;
    flow.sprint.reset();
    const auto plain = train::estimate_memory(flow);
    INFO("a flow step of the student: " << plain.activations);
    CHECK(e.activations > (largest ? 2.2 : 1.5) * plain.activations);
    CHECK(e.total() > plain.total() + e.teacher + e.heads);
  }
}

TEST_CASE("activations at another micro-batch and checkpointing, from the one measurement", "[train][memory]") {
  // At the estimate's own settings, its own figures; the suggestion's sizes fit its budget
  // and one more step of the size would not.
  auto cfg = tiny_config();
  cfg.train.gc_step = 1;
  const auto e = train::estimate_memory(train::memory_estimate_options_for(cfg));
  const auto spec = train::model_spec_for(cfg);
  CHECK(train::activations_at(e, spec, e.micro_batch, 0) == e.activations);
  CHECK(train::activations_at(e, spec, e.micro_batch, 1) == e.activations_checkpointed);
  CHECK(train::activations_at(e, spec, 2 * e.micro_batch, 0) == Approx(2 * e.activations));
  CHECK(train::activations_at(e, spec, e.micro_batch, 2) < e.activations);
  CHECK(train::activations_at(e, spec, e.micro_batch, 2) > e.activations_checkpointed);
  const double state = e.total() - e.activations_for_config();
  const double budget = state + train::activations_at(e, spec, 4, 0) + 1;
  const auto s = train::suggest_micro_batch(e, spec, budget, 64);
  REQUIRE(s.largest.size() == 3);
  CHECK(s.largest[0].gc_step == 0);
  CHECK(s.largest[0].micro_batch == 4);
  CHECK(s.largest[1].micro_batch >= 4);
  CHECK(s.largest[2].micro_batch >= s.largest[1].micro_batch);
  for (const auto& c : s.largest) {
    CHECK(c.bytes <= budget);
    if (c.micro_batch < 64) CHECK(state + train::activations_at(e, spec, 2 * c.micro_batch, c.gc_step) > budget);
  }
  // The pick: the least recomputation whose micro-batch holds 16384 image tokens (or all 64
  // samples), else the largest micro-batch.
  const int64_t enough = std::min<int64_t>(64, (16384 + e.tokens - 1) / e.tokens);
  const auto first_enough = std::find_if(s.largest.begin(), s.largest.end(),
                                         [&](const train::MicroBatchChoice& c) { return c.micro_batch >= enough; });
  if (first_enough != s.largest.end()) {
    CHECK(s.pick.gc_step == first_enough->gc_step);
  } else {
    CHECK(s.pick.micro_batch == s.largest[2].micro_batch);
  }
  // At equal sizes the least recomputation: a budget every setting fits at the most.
  const auto roomy = train::suggest_micro_batch(e, spec, state + train::activations_at(e, spec, 6, 0), 6);
  CHECK(roomy.pick.micro_batch == 6);
  CHECK(roomy.pick.gc_step == 0);
  CHECK(train::suggest_micro_batch(e, spec, state / 2, 64).pick.micro_batch == 0);
  // The estimate at a pick (what micro_batch_size auto runs, as `sana-train model` shows it)
  // is the estimate of the config with those numbers written out.
  for (const auto& c : s.largest) {
    auto written = cfg;
    written.train.micro_batch_size = c.micro_batch;
    written.train.grad_checkpointing = c.gc_step > 0;
    written.train.gc_step = std::max<int64_t>(c.gc_step, 1);
    const auto direct = train::estimate_memory(train::memory_estimate_options_for(written));
    const auto at = train::estimate_at(e, spec, c);
    INFO("micro-batch " << c.micro_batch << ", gc_step " << c.gc_step);
    CHECK(at.total() == Approx(direct.total()).epsilon(1e-9));
    CHECK(at.total() == Approx(c.bytes).epsilon(1e-12));
    CHECK(at.micro_batch == c.micro_batch);
    CHECK(at.checkpointing == (c.gc_step > 0));
  }
  // The largest share: global batches split as the ranks' shares are, at most one apart.
  CHECK(train::largest_share(8, 2) == 4);
  CHECK(train::largest_share(10, 4) == 3);
  CHECK(train::largest_share(3, 8) == 1);
}

TEST_CASE("the activation estimate is the same at one thread and at two", "[train][memory]") {
  // At 1152 channels the measured 8 x 8-token products are large enough for the threaded CPU
  // path (layers.cpp), which the estimate must not measure: a GPU runs torch::linear.
  auto cfg = tiny_config();
  cfg.model.model = "SanaMS_600M_P1_D28";
  const auto options = train::memory_estimate_options_for(cfg);
  REQUIRE(options.spec.hidden * 64 >= (int64_t{1} << 16));
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const auto two = train::estimate_memory(options);
  at::set_num_threads(1);
  const auto one = train::estimate_memory(options);
  at::set_num_threads(threads);
  CHECK(two.activations == one.activations);
  CHECK(two.activations_checkpointed == one.activations_checkpointed);
}
