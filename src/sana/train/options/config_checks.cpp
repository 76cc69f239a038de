#include "sana/train/options/config_checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "sana/config/checks.h"
#include "sana/data/buckets.h"
#include "sana/data/dataset.h"
#include "sana/model/spec.h"
#include "sana/train/options/core_options.h"

namespace sana {

namespace {

// The preset's shape against the model keys, and every bucket against the model's cell
// (VAE downsampling x patch size): a bucket the model cannot tile is a config error now,
// not a shape error at the first batch of that bucket.
void check_model(const config::Config& cfg, config::IssueSink& issues) {
  model::ModelSpec spec;
  try {
    spec = train::model_spec_for(cfg);
  } catch (const model::SpecError& e) {
    issues.fail(e.key(), e.message());
    return;
  }
  const int64_t cell = spec.downsample * spec.patch;
  std::vector<data::BucketTable> tables;
  try {
    tables = data::bucket_tables_for(train::bucket_options_for(cfg));
  } catch (const std::exception&) {
    return;  // the table itself is reported by config's own checks
  }
  const bool generated = cfg.data.aspect_ratio_type == "generated";
  for (const auto& table : tables) {
    for (const auto& b : table.buckets()) {
      if (b.height % cell == 0 && b.width % cell == 0) continue;
      issues.fail(generated ? "data.bucket_step" : "model.model",
                  fmt::format("bucket {}x{} of the {} px table is not a multiple of {} (the model's "
                              "cell: {} px per {} x patch {} of {})",
                              b.height, b.width, table.base(), cell, spec.downsample,
                              spec.downsample == 1 ? "pixel" : "latent", spec.patch, spec.name),
                  generated ? fmt::format("use a data.bucket_step that is a multiple of {}", cell)
                            : "use a preset with a smaller patch size");
      return;
    }
  }
}

// data.class_data_dir (DreamBooth's prior preservation): the class images go through the
// VAE and class_prompt through the text encoder, beside each batch.
void check_prior_preservation(const config::Config& cfg, config::IssueSink& issues) {
  if (!config::prior_preservation(cfg.data)) return;
  if (cfg.data.load_vae_feat || cfg.data.load_text_feat) {
    issues.fail("data.class_data_dir",
                fmt::format("is set with precomputed features (data.{}): the class images are encoded from "
                            "pixels, and class_prompt by the text encoder, as each batch trains",
                            cfg.data.load_vae_feat ? "load_vae_feat" : "load_text_feat"),
                "train from images (data.load_vae_feat and load_text_feat false), or leave data.class_data_dir empty");
  }
  model::ModelSpec spec;
  try {
    spec = train::model_spec_for(cfg);
  } catch (const model::SpecError&) {
    return;  // the model's own check names it
  }
  if (spec.control_blocks > 0) {
    issues.fail("data.class_data_dir",
                fmt::format("is set for {}, a ControlNet: prior preservation pairs each sample with a class "
                            "image, which has no control map here",
                            spec.name),
                "leave data.class_data_dir empty for a ControlNet");
  }
  if (spec.conditioning == model::Conditioning::class_label) {
    issues.fail("data.class_data_dir",
                fmt::format("is set for a class-label model ({}): its class images would need labels; prior "
                            "preservation is built for caption-conditioned and unconditional models",
                            spec.name),
                "leave data.class_data_dir empty");
  }
  if (spec.conditioning == model::Conditioning::caption && cfg.data.class_prompt.empty()) {
    issues.fail("data.class_prompt",
                fmt::format("is empty, but data.class_data_dir is set and {} is caption-conditioned: the class "
                            "images train (and missing ones are generated) with this caption",
                            spec.name),
                "set it to the class the subject belongs to, e.g. \"a photo of a dog\"");
  }
}

// What a flow run offers that stage 2 does not act on yet: refused, not ignored.
void check_stage2_keys(const config::Config& cfg, config::IssueSink& issues) {
  const auto not_in_stage2 = [&](const char* key, bool set, const char* why) {
    if (set) issues.fail(key, fmt::format("is not built for SANA-Sprint's stage 2: {}", why), "remove it for stage 2");
  };
  const auto& tr = cfg.train;
  not_in_stage2("train.lora", config::lora_enabled(tr), "stage 2 trains the whole student");
  not_in_stage2("train.zero_stage", tr.zero_stage > 1,
                "stages 2 and 3 are not built with the two-pass generator and the JVP; 0 or 1 are");
  not_in_stage2("train.offload_optimizer", tr.offload_optimizer, "the heads' optimizer has no host copy");
  not_in_stage2("model.mixed_precision", cfg.model.mixed_precision == config::Precision::fp16,
                "fp16 loss scaling is not built for the two optimizers; bf16 is upstream's");
  not_in_stage2("data.class_data_dir", config::prior_preservation(cfg.data), "there is no flow loss to add it to");
  not_in_stage2("train.eval", tr.eval.every_steps > 0, "the held-out loss is the flow loss, which the student leaves");
  not_in_stage2("train.masked_loss", tr.masked_loss, "the sCM and adversarial losses take no masks");
}

// Stage 2's own options and its teacher: the losses and times built, the teacher's width
// and the blocks the heads read.
void check_stage2_teacher(const config::Config& cfg, const model::ModelSpec& spec, config::IssueSink& issues) {
  const auto& m = cfg.model.sprint;
  const auto& t = cfg.train.sprint;
  const auto& sc = cfg.scheduler;
  if (sc.timestep_norm_scale_factor == 1.0 && sc.timestep_grid == config::TimestepGrid::integer) {
    issues.fail("scheduler.timestep_norm_scale_factor",
                "1 with scheduler.timestep_grid integer truncates the student's timesteps to integers, as upstream's "
                "forward does, so the JVP has no time derivative and the sCM tangent loses its time term",
                "set 1000 as upstream's Sprint YAMLs do (the model then sees sigma), with a teacher trained so "
                "(stage 1's normT fine-tune)");
  }
  if (t.discriminator_loss != "hinge") {
    issues.fail("train.discriminator_loss", fmt::format("'{}' is not built; the hinge loss is (upstream's Sprint "
                                                        "YAMLs set it)", t.discriminator_loss),
                "set it to hinge");
  }
  if (!t.scm_loss) issues.fail("train.scm_loss", "false is not built: the generator's phase trains the sCM loss");
  if (t.scm_cfg_scale.empty()) issues.fail("train.scm_cfg_scale", "is empty: each sample draws its guidance scale from it");
  for (const auto& [key, w] : {std::pair{"scheduler.weighting_scheme", cfg.scheduler.weighting_scheme},
                               std::pair{"scheduler.weighting_scheme_discriminator",
                                         cfg.scheduler.sprint.weighting_scheme_discriminator}}) {
    if (w != config::Weighting::logit_normal_trigflow) {
      issues.fail(key, "stage 2 draws TrigFlow times", "set it to logit_normal_trigflow");
    }
  }
  if (!m.teacher.empty()) {
    const auto& p = model::presets();
    if (std::none_of(p.begin(), p.end(), [&](const model::Preset& x) { return x.name == m.teacher; })) {
      issues.fail("model.teacher", fmt::format("unknown preset '{}'", m.teacher));
      return;
    }
  }
  const auto teacher = train::teacher_spec_for(cfg);
  if (teacher.hidden != spec.hidden) {
    issues.fail("model.teacher", fmt::format("{} is {} wide, the student {} {}: the heads read the teacher's tokens "
                                             "at the student's width", teacher.name, teacher.hidden, spec.name,
                                             spec.hidden));
  }
  const auto blocks = train::head_blocks_for(cfg);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] >= teacher.depth || (i > 0 && blocks[i] <= blocks[i - 1])) {
      issues.fail("model.head_block_ids",
                  fmt::format("[{}]{} are not ascending blocks of the teacher {}'s {}", fmt::join(blocks, ", "),
                              m.head_block_ids.empty() ? " (upstream's default)" : "", teacher.name, teacher.depth),
                  "name the teacher blocks the heads read, e.g. [2, 8, 14, 19] as upstream's 1.6B YAML");
      break;
    }
  }
}

// SANA-Sprint: the student's keys only on a SanaMSCM preset, and stage 2's options where
// the preset asks for it (docs/sprint.md).
void check_sprint(const config::Config& cfg, config::IssueSink& issues) {
  model::ModelSpec spec;
  try {
    spec = train::model_spec_for(cfg);
  } catch (const model::SpecError&) {
    return;  // the model's own check names it
  }
  const auto& m = cfg.model.sprint;
  if (!spec.trigflow) {
    const auto student_only = [&](const char* key, bool set) {
      if (!set) return;
      issues.fail(key, fmt::format("is SANA-Sprint's stage 2, which trains a SanaMSCM_* preset; {} is a flow model",
                                   spec.name),
                  "use a SanaMSCM_* preset for stage 2 (docs/sprint.md), or remove the key");
    };
    student_only("model.cfg_embed", m.cfg_embed);
    student_only("model.logvar", m.logvar);
    student_only("scheduler.weighting_scheme", cfg.scheduler.weighting_scheme == config::Weighting::logit_normal_trigflow);
    student_only("scheduler.vis_sampler", cfg.scheduler.vis_sampler == "scm");
    return;
  }
  if (spec.conditioning != model::Conditioning::caption) {
    issues.fail("model.model", fmt::format("{} is SANA-Sprint's caption-conditioned student; this config has no "
                                           "captions (text_encoder or data.load_text_feat)", spec.name));
  }
  // Without a teacher the config only describes a student (previews, export, `sana-train
  // model`); training one says so (train/loop/trainer.cpp).
  if (m.teacher_model.empty()) return;
  check_stage2_keys(cfg, issues);
  check_stage2_teacher(cfg, spec, issues);
}

// dist.elastic continue: the survivors go on with the state every rank holds whole. What
// holds a share per rank (ZeRO, a rank's own offloaded masters), a state the lost rank's
// share of the step changes (train.deterministic's integer sums, SANA-Sprint's two
// phases), or a plan tied to the world size (data.sampler distributed) is not covered yet.
void check_elastic(const config::Config& cfg, config::IssueSink& issues) {
  if (cfg.dist.elastic != config::Elastic::continue_on) return;
  const std::string fix = "set dist.elastic: restart (a lost rank restarts every rank from the last checkpoint)";
  const auto refuse = [&](const char* key, bool set, const char* why) {
    if (set) issues.fail(key, fmt::format("does not go with dist.elastic: continue yet: {}", why), fix);
  };
  refuse("train.offload_optimizer", cfg.train.offload_optimizer, "each rank's host masters are its own share");
  refuse("data.sampler", cfg.data.sampler == config::DataSampler::distributed,
         "torch's DistributedSampler gives each world size other samples; the bucket sampler does not");
  refuse("ddp.broadcast_buffers", cfg.ddp.broadcast_buffers,
         "an abandoned broadcast of the old group could still write into the model's buffers");
  refuse("data.cache", cfg.data.cache != config::SampleCacheMode::none, "the cache is shared per node by rank");
  try {
    refuse("model.model", train::model_spec_for(cfg).trigflow && !cfg.model.sprint.teacher_model.empty(),
           "SANA-Sprint's stage 2 alternates two reducers and optimizers");
  } catch (const model::SpecError&) {
  }
}

}  // namespace

void register_checks() {
  std::vector<std::string> names;
  for (const auto& p : model::presets()) names.push_back(p.name);
  config::register_choices("model.model", std::move(names));
  config::register_check("model and buckets", check_model);
  config::register_check("data.class_data_dir", check_prior_preservation);
  config::register_check("SANA-Sprint", check_sprint);
  config::register_check("dist.elastic", check_elastic);
}

}  // namespace sana
