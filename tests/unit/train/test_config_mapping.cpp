// The config mapping (train/options/): every table names keys of the schema, in types its
// fields take, and a value set in the YAML reaches the part that reads it.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.h"
#include "config/config_test_support.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/from_keys.h"
#include "sana/train/options/torch_options.h"
#include "sana/util/error.h"

namespace {

const char* kRun = "data: {data_dir: [images]}\nmodel: {model: SanaMS_tiny_P2_D4}\n";

}  // namespace

TEST_CASE("Every table of the config mapping takes its keys, and a value set reaches its part", "[options]") {
  TempDir dir;
  const Config c = load_text(dir, kRun,
                             {"--ckpt.keep_last_n=7", "--dist.threads_per_process=3", "--data.del_img_clip_thr=0.3",
                              "--model_growth.init_params.noise_scale=0.125", "--train.gc_step=2",
                              "--text_encoder.model_max_length=77", "--scheduler.flow_shift=2.5"});
  const sana::train::TestHooks hooks;
  CHECK(sana::train::checkpoint_options_for(c).keep_last_n == 7);
  CHECK(sana::train::runtime_options_for(c, hooks).threads_per_process == 3);
  CHECK(sana::train::dataset_options_for(c).filter.min_clip_score == Approx(0.3));
  CHECK(sana::train::growth_options_for(c).noise_scale == Approx(0.125));
  CHECK(sana::train::initial_model_options_for(c).gc_step == 2);
  CHECK(sana::train::loader_options_for(c).text_length == 77);
  CHECK(sana::train::model_spec_for(c).caption_tokens == 77);
  CHECK(sana::train::timestep_options_for(c).flow_shift == Approx(2.5));
  CHECK(sana::train::preview_sources_for(c).sampling.flow_shift == Approx(2.5));
  // The other tables of a plain run: no key missing from the schema, none of a type its field refuses.
  CHECK_NOTHROW(sana::train::batch_options_for(c));
  CHECK_NOTHROW(sana::train::shared_dataset_options_for(c));
  CHECK_NOTHROW(sana::train::sample_cache_options_for(c));
  CHECK_NOTHROW(sana::train::disk_cache_options_for(c));
  CHECK_NOTHROW(sana::train::reducer_options_for(c));
  CHECK_NOTHROW(sana::train::metrics_options_for(c));
  CHECK_NOTHROW(sana::train::step_options_for(c, hooks, 0, 1, false));
  CHECK_NOTHROW(sana::train::preview_policy_for(c));
  CHECK_NOTHROW(sana::train::class_image_options_for(c));
  CHECK_NOTHROW(sana::train::memory_estimate_options_for(c));
  CHECK_NOTHROW(sana::train::resume_options_for(c, "SanaMS_tiny_P2_D4"));
  CHECK_NOTHROW(sana::train::lora_options_for(c));
  CHECK_NOTHROW(sana::train::decode_options_for(c));
  CHECK_NOTHROW(sana::train::caption_choice_for(c));
}

TEST_CASE("SANA-Sprint's tables take the keys its sections flatten", "[options]") {
  const std::string yaml = std::string(SANA_SOURCE_DIR) +
                           "/tests/configs/upstream/sana_sprint_1024ms/SanaSprint_1600M_1024px_allqknorm_bf16_scm_ladd.yaml";
  std::vector<ConfigIssue> issues;
  const auto overrides = parse_overrides({"--scheduler.logit_mean_discriminator=0.25", "--train.scm_lambda=0.75"}, issues);
  REQUIRE(issues.empty());
  const Config c = load_config({yaml}, overrides, no_paths());
  const auto o = sana::train::sprint_options_for(c);
  CHECK(o.draws.logit_mean_d == Approx(0.25));
  CHECK(o.scm_lambda == Approx(0.75));
  CHECK(o.sigma_data == Approx(0.5));  // scheduler.sigma_data, as the YAML sets it
  CHECK(sana::train::sprint_step_options_for(c).teacher_model == c.model.sprint.teacher_model);
  CHECK(sana::train::model_spec_for(c).cfg_embed);
}

TEST_CASE("A table row refuses a key the schema lacks, a type its field cannot take, a value out of its range",
          "[options]") {
  TempDir dir;
  const Config c = load_text(dir, kRun, {"--train.max_steps=1099511627776"});  // 2^40
  struct Fields {
    int32_t small = 0;
    int64_t large = 0;
    std::string text;
  } f;
  sana::train::fill_from_keys(c, {{f.large, "train.max_steps"}});
  CHECK(f.large == 1099511627776);
  CHECK_THROWS_AS(sana::train::fill_from_keys(c, {{f.large, "train.max_stepz"}}), std::logic_error);
  CHECK_THROWS_WITH(sana::train::fill_from_keys(c, {{f.text, "train.max_steps"}}),
                    Catch::Contains("key 'train.max_steps' holds an integer"));
  CHECK_THROWS_AS(sana::train::fill_from_keys(c, {{f.small, "train.max_steps"}}), sana::UsageError);
  CHECK_THROWS_WITH(sana::train::fill_from_keys(c, {{f.small, "train.max_steps"}}),
                    Catch::Contains("train.max_steps: 1099511627776 is out of the range"));
  sana::train::fill_from_keys(c, {{f.text, "model.model"}, {f.small, "train.gc_step"}});
  CHECK(f.text == "SanaMS_tiny_P2_D4");
  CHECK(f.small == 1);
}
