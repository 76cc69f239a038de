// NVlabs/Sana's own YAMLs (verbatim copies in tests/configs/upstream/) load unchanged:
// moved keys are read at upstream's path, upstream's value names are translated, keys with
// no effect here are accepted with a note, and values we cannot honour are errors.
#include <algorithm>
#include <filesystem>

#include "config_test_support.h"
#include "sana/config/upstream.h"
#include "sana/train/options/core_options.h"

namespace {

std::string upstream_yaml(const std::string& name) {
  return std::string(SANA_SOURCE_DIR) + "/tests/configs/upstream/" + name;
}

bool noted(const Config& c, const std::string& fragment) {
  return std::any_of(c.load_notes.begin(), c.load_notes.end(),
                     [&](const std::string& n) { return n.find(fragment) != std::string::npos; });
}

}  // namespace

TEST_CASE("every upstream sana_config YAML loads unchanged", "[config][upstream]") {
  const char* files[] = {
      "512ms/Sana_600M_img512.yaml",      "512ms/Sana_600M_img256.yaml",
      "512ms/Sana_1600M_img512.yaml",     "512ms/ci_Sana_600M_img512.yaml",
      "512ms/sample_dataset.yaml",        "1024ms/Sana_600M_img1024.yaml",
      "1024ms/Sana_1600M_img1024.yaml",   "1024ms/Sana_1600M_img1024_AdamW.yaml",
      "1024ms/Sana_1600M_img1024_CAME8bit.yaml", "2048ms/Sana_1600M_img2048_bf16.yaml",
      "4096ms/Sana_1600M_img4096_bf16.yaml",
      // SANA-1.5 (configs/sana1-5_config/1024ms/)
      "sana1-5_1024ms/Sana_1600M_1024px_AdamW_fsdp.yaml",
      "sana1-5_1024ms/Sana_1600M_1024px_allqknorm_bf16_lr2e5.yaml",
      "sana1-5_1024ms/Sana_3200M_1024px_came8bit_grow_constant_allqknorm_bf16_lr2e5.yaml",
      "sana1-5_1024ms/Sana_4800M_1024px_came8bit_grow_constant_allqknorm_bf16_lr2e5.yaml",
      // configs/sana_controlnet_config/
      "controlnet/Sana_600M_img1024_controlnet.yaml",
      "controlnet/Sana_1600M_1024px_controlnet_bf16.yaml",
      // SANA-Sprint's stage 1, the teacher fine-tune (configs/sana_sprint_config/1024ms/)
      "sana_sprint_1024ms/SanaSprint_1600M_img1024_bf16_normT_allqknorm_teacher_ft.yaml",
      // and stage 2, sCM + LADD
      "sana_sprint_1024ms/SanaSprint_1600M_1024px_allqknorm_bf16_scm_ladd.yaml",
      "sana_sprint_1024ms/SanaSprint_1600M_1024px_allqknorm_bf16_scm_ladd_dc_ae_lite.yaml",
      "sana_sprint_1024ms/SanaSprint_600M_1024px_allqknorm_bf16_scm_ladd.yaml",
      "sana_sprint_1024ms/SanaSprint_600M_1024px_allqknorm_bf16_scm_ladd_dc_ae_lite.yaml",
  };
  for (const char* name : files) {
    INFO(name);
    const Config c = load_config({upstream_yaml(name)}, {}, no_paths());
    CHECK(c.work_dir == "output/debug");  // train.work_dir, upstream's place for it
    CHECK(c.vae.vae_type == VaeType::dc_ae);  // dc-ae and AutoencoderDC
    CHECK(uses_text_encoder(c.text_encoder));
    CHECK_FALSE(c.load_notes.empty());
    // What it prints loads back to the same config (the derived batch is not written twice).
    TempDir dir;
    Config again = load_config({dir.write("printed.yaml", to_yaml(c))}, {}, no_paths());
    Config first = c;
    again.load_notes.clear();  // the upstream keys' notes are gone: the printed YAML has none
    first.load_notes.clear();
    CHECK(to_yaml(again) == to_yaml(first));
  }
}

TEST_CASE("upstream keys act, move or are accepted with a note", "[config][upstream]") {
  const Config c = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")}, {}, no_paths(8));
  CHECK(c.data.aspect_ratio_type == "ASPECT_RATIO_512");  // model.aspect_ratio_type
  CHECK(c.train.optimizer.type == OptimizerType::CAME);   // CAMEWrapper
  CHECK(c.train.optimizer.eps == std::vector<double>{1e-30, 1e-16});
  CHECK(c.model.mixed_precision == Precision::fp16);
  CHECK(c.scheduler.flow_shift == 3.0);
  CHECK(c.scheduler.vis_sampler == "flow_dpm-solver");
  CHECK(c.text_encoder.chi_prompt.size() == 8);
  CHECK(c.text_encoder.chi_prompt.back() == "User Prompt: ");
  // train_batch_size is per process: 128 x accumulation 1 x 8 processes.
  CHECK(c.train.micro_batch_size == 128);
  CHECK(c.train.global_batch_size == 1024);
  CHECK(accumulation_steps(c.train, 8) == 1);
  // The caption choice acts (tests/apps/upstream_captions.sh): read, not noted.
  CHECK(c.data.clip_thr == 25.0);
  CHECK(c.data.clip_thr_temperature == 0.1);
  CHECK(c.data.external_caption_suffixes == std::vector<std::string>{"", "_InternVL2-26B", "_VILA1-5-13B"});
  CHECK(c.data.external_clipscore_suffixes.size() == 3);
  CHECK(c.data.caption_proportion == NamedWeights{{"prompt", 1.0}});
  CHECK_FALSE(noted(c, "data.clip_thr"));
  // sana_base.yaml's hq_only acts; its valid_num has no effect upstream either.
  const Config base = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")},
                                  {{"data.hq_only", "true", "--data.hq_only=true"},
                                   {"data.valid_num", "3", "--data.valid_num=3"}},
                                  no_paths(8));
  CHECK(base.data.hq_only);
  CHECK(noted(base, "data.valid_num is accepted with no effect"));
  CHECK(noted(base, "never uses it"));
  CHECK(noted(c, "train.online_metric is accepted with no effect"));
  CHECK(noted(c, "model.aspect_ratio_type is read as data.aspect_ratio_type"));
  CHECK(noted(c, "CAMEWrapper is CAME"));
  CHECK(noted(c, "train.global_batch_size is 1024"));

  const Config t5 = load_config({upstream_yaml("512ms/Sana_600M_img256.yaml")}, {}, no_paths());
  CHECK(t5.scheduler.predict_flow_v);  // written as predict_v there
  CHECK(t5.text_encoder.caption_channels == 4096);  // T5's width, as upstream's encoder gives it
  CHECK(t5.model.use_pe);
  CHECK(t5.model.qk_norm);
  CHECK(t5.train.zero_stage == 3);  // use_fsdp: true
  CHECK(noted(t5, "train.use_fsdp: true is train.zero_stage: 3 here"));

  const Config pe = load_config({upstream_yaml("4096ms/Sana_1600M_img4096_bf16.yaml")}, {}, no_paths());
  CHECK(pe.data.aspect_ratio_type == "ASPECT_RATIO_4096");
  CHECK(pe.model.use_pe);
  CHECK(pe.model.pe_interpolation == 2.0);
  CHECK(pe.model.mixed_precision == Precision::bf16);

  const Config came8 = load_config({upstream_yaml("1024ms/Sana_1600M_img1024_CAME8bit.yaml")}, {}, no_paths());
  // CAME8BitWrapper acts: 8-bit first moments with upstream's block_size and min_8bit_size.
  CHECK(came8.train.optimizer.type == OptimizerType::CAME8bit);
  CHECK(came8.train.optimizer.betas == std::vector<double>{0.9, 0.999, 0.9999});
  CHECK_FALSE(noted(came8, "train.optimizer.block_size"));
  CHECK_FALSE(noted(came8, "8-bit"));
  // AdamW8bitWrapper (bitsandbytes' AdamW8bit) acts too, with bitsandbytes' min_8bit_size.
  const Config adamw8 = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")},
                                    {{"train.optimizer.type", "AdamW8bitWrapper", ""},
                                     {"train.optimizer.betas", "[0.9, 0.999]", ""}, {"train.optimizer.eps", "[1e-8]", ""}},
                                    no_paths(8));
  CHECK(adamw8.train.optimizer.type == OptimizerType::AdamW8bit);
  CHECK(adamw8.train.optimizer.min_8bit_size == 4096);

  // Upstream's top-level report_to: TensorBoard is the tracker here; wandb becomes it with a note.
  const Config tb = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")}, {{"report_to", "tensorboard", ""}},
                                no_paths(8));
  CHECK(tb.train.report_to == "tensorboard");
  const Config wandb = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")}, {{"report_to", "wandb", ""}},
                                   no_paths(8));
  CHECK(wandb.train.report_to == "tensorboard");
  CHECK(noted(wandb, "no wandb here"));
}

TEST_CASE("upstream's batch style and auto_lr forms", "[config][upstream]") {
  TempDir dir;
  const Config acc = load_text(dir, "train:\n  train_batch_size: 4\n  gradient_accumulation_steps: 3\n", {},
                               no_paths(2));
  CHECK(acc.train.micro_batch_size == 4);
  CHECK(acc.train.global_batch_size == 24);
  CHECK(accumulation_steps(acc.train, 2) == 3);
  // Only gradient_accumulation_steps: upstream's train_batch_size default, 32.
  CHECK(load_text(dir, "train:\n  gradient_accumulation_steps: 2\n").train.global_batch_size == 64);
  // Both styles at once cannot both hold.
  auto both = issues_of(dir, "train:\n  train_batch_size: 4\n  global_batch_size: 16\n");
  CHECK(mentions(both, "train.global_batch_size", "use one style"));

  CHECK(load_text(dir, "train:\n  auto_lr:\n    rule: linear\n").train.auto_lr == AutoLr::linear);
  CHECK(load_text(dir, "train:\n  auto_lr: {rule: sqrt}\n").train.auto_lr == AutoLr::sqrt);
  CHECK(load_text(dir, "train:\n  auto_lr: {}\n").train.auto_lr == AutoLr::none);
  CHECK(load_text(dir, "train:\n  auto_lr:\n").train.auto_lr == AutoLr::none);
  CHECK(load_text(dir, "").train.auto_lr == AutoLr::sqrt);  // upstream's default
}

TEST_CASE("upstream values that cannot be honoured are errors, not silence", "[config][upstream]") {
  TempDir dir;
  CHECK(mentions(issues_of(dir, "scheduler:\n  pred_sigma: true\n"), "scheduler.pred_sigma",
                 "flow matching predicts no variance"));
  CHECK(mentions(issues_of(dir, "model:\n  mlp_acts: [gelu, gelu, null]\n"), "model.mlp_acts",
                 "set it to [silu, silu, null]"));
  CHECK(mentions(issues_of(dir, "train:\n  snr_loss: true\n"), "train.snr_loss", "not supported here"));
  // The accepted forms of the same keys load: `-` and `null` are the same YAML value.
  CHECK_NOTHROW(load_text(dir, "model:\n  mlp_acts:\n    - silu\n    - silu\n    -\n"));
  CHECK_NOTHROW(load_text(dir, "scheduler:\n  pred_sigma: False\n"));
  // A key and its upstream alias with different values: the later line wins, with a note.
  const Config twice = load_text(dir, "work_dir: a\ntrain:\n  work_dir: b\n");
  CHECK(twice.work_dir == "b");
  CHECK(std::any_of(twice.load_notes.begin(), twice.load_notes.end(),
                    [](const std::string& n) { return n.find("the later one") != std::string::npos; }));
}

TEST_CASE("hub model names run from their folders on this machine, or say where to get them", "[config][upstream]") {
  TempDir dir;
  const std::string data = dir.path("data");
  std::filesystem::create_directories(data);
  const std::string yaml = "data:\n  data_dir: [" + data +
                           "]\nvae:\n  vae_type: dc-ae\n  vae_pretrained: mit-han-lab/dc-ae-f32c32-sana-1.0\n"
                           "text_encoder:\n  text_encoder_name: gemma-2-2b-it\n";
  const ValidationContext run{1, true};
  sana::test::EnvVar cache("HF_HUB_CACHE", dir.path("hub").c_str());
  sana::test::EnvVar models("SANA_MODELS_DIR", nullptr);
  const auto issues = issues_of(dir, yaml, {}, run);
  // The VAE by its hub name: not downloaded, and efficientvit's layout where diffusers' is read.
  CHECK(mentions(issues, "vae.vae_pretrained", "'mit-han-lab/dc-ae-f32c32-sana-1.0' is not on this machine"));
  CHECK(mentions(issues, "vae.vae_pretrained", "huggingface-cli download mit-han-lab/dc-ae-f32c32-sana-1.0"));
  CHECK(mentions(issues, "vae.vae_pretrained", "its diffusers repo is mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers"));
  CHECK(mentions(issues, "vae.vae_pretrained", "load_vae_feat"));
  // efficientvit's folder (model.safetensors, no diffusers config) is read as its name says.
  dir.write("hub/models--mit-han-lab--dc-ae-f32c32-sana-1.0/snapshots/e1/model.safetensors", "");
  CHECK_NOTHROW(load_text(dir, yaml, {"--data.load_text_feat=true"}, run));
  dir.write("hub/models--mit-han-lab--dc-ae-f32c32-sana-1.0-diffusers/snapshots/d1/config.json",
            "{\"_class_name\": \"AutoencoderDC\"}");
  CHECK_NOTHROW(load_text(dir, yaml,
                          {"--vae.vae_pretrained=mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers",
                           "--data.load_text_feat=true"},
                          run));
  // Gemma-2 by upstream's name: its hub repo, looked for in the cache, with the command to run.
  CHECK(mentions(issues, "text_encoder.text_encoder_path", "'Efficient-Large-Model/gemma-2-2b-it' is not on this machine"));
  CHECK(mentions(issues, "text_encoder.text_encoder_path", dir.path("hub/models--Efficient-Large-Model--gemma-2-2b-it")));
  CHECK(mentions(issues, "text_encoder.text_encoder_path", "huggingface-cli download Efficient-Large-Model/gemma-2-2b-it"));
  // Once the folder is in the cache, the name runs (its tokenizer.model is what is checked).
  dir.write("hub/models--Efficient-Large-Model--gemma-2-2b-it/snapshots/abc/config.json", "{}");
  dir.write("hub/models--Efficient-Large-Model--gemma-2-2b-it/refs/main", "abc");
  const auto cached = issues_of(dir, yaml, {"--data.load_vae_feat=true"}, run);
  CHECK_FALSE(mentions(cached, "text_encoder.text_encoder_path", "not on this machine"));
  CHECK(mentions(cached, "text_encoder.text_encoder_path", "snapshots/abc/tokenizer.model' does not exist"));
  dir.write("hub/models--Efficient-Large-Model--gemma-2-2b-it/snapshots/abc/tokenizer.model", "");
  CHECK_NOTHROW(load_text(dir, yaml, {"--data.load_vae_feat=true"}, run));
  // Upstream's other encoders name what runs natively.
  const auto t5 = issues_of(dir, yaml, {"--text_encoder.text_encoder_name=T5-xxl", "--data.load_vae_feat=true"}, run);
  CHECK(mentions(t5, "text_encoder.text_encoder_path", "T5-xxl has no native encoder here"));
  CHECK(mentions(t5, "text_encoder.text_encoder_path", "gemma-2-2b, gemma-2-2b-it, gemma-2-9b, gemma-2-9b-it"));
  // Precomputed features need neither encoder.
  CHECK_NOTHROW(load_text(dir, yaml, {"--data.load_vae_feat=true", "--data.load_text_feat=true"}, run));
  CHECK(looks_like_hub_name("Efficient-Large-Model/gemma-2-2b-it"));
  CHECK_FALSE(looks_like_hub_name("exports/vae.pt"));
  CHECK_FALSE(looks_like_hub_name("/abs/vae"));
}

TEST_CASE("upstream's weighting_scheme mode trains uniform timesteps, as its train.py", "[config][upstream]") {
  // Upstream's train.py draws u from the density for logit_normal only; every other scheme,
  // 'mode' included, takes torch.randint over the grid: uniform.
  const Config mode = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")},
                                  {{"scheduler.weighting_scheme", "mode", ""}}, no_paths(8));
  CHECK(mode.scheduler.weighting_scheme == Weighting::uniform);
  CHECK(noted(mode, "'mode' trains uniform timesteps"));
  CHECK(sana::train::timestep_options_for(mode).weighting == sana::diffusion::Weighting::uniform);
  // SD3's mode density stays available under its own name.
  const Config sd3 = load_config({upstream_yaml("512ms/Sana_600M_img512.yaml")},
                                 {{"scheduler.weighting_scheme", "sd3_mode", ""}}, no_paths(8));
  CHECK(sd3.scheduler.weighting_scheme == Weighting::sd3_mode);
  CHECK(sana::train::timestep_options_for(sd3).weighting == sana::diffusion::Weighting::sd3_mode);
}

TEST_CASE("upstream's model_growth section acts: the options the grower takes", "[config][upstream]") {
  TempDir dir;
  // As upstream's SANA-1.5 runs pass it: a 20-block checkpoint grown into a 60-block model.
  const Config c = load_text(dir,
                             "model: {model: SanaMS_4800M_P1_D60}\n"
                             "model_growth:\n  pretrained_ckpt_path: d20.pth\n  init_strategy: block_expand\n"
                             "  source_num_layers: 20\n  target_num_layers: 60\n"
                             "  init_params: {expand_ratio: 3, noise_scale: 0.01, zero_gate: true}\n");
  const auto g = sana::train::growth_options_for(c);
  CHECK(g.source == "d20.pth");
  CHECK(g.strategy == sana::model::GrowthStrategy::block_expand);
  CHECK((g.source_layers == 20 && g.target_layers == 60 && g.expand_ratio == 3 && g.zero_gate));
  CHECK(g.seed == static_cast<uint64_t>(c.train.seed));
  // Without the section there is no growth.
  CHECK(sana::train::growth_options_for(load_text(dir, "model: {model: SanaMS_600M_P1_D28}\n")).source.empty());
  CHECK(mentions(issues_of(dir, "model_growth: {init_strategy: stretch}\n"), "model_growth.init_strategy", "stretch"));
  CHECK(mentions(issues_of(dir, "model: {load_from: a.pth}\nmodel_growth: {pretrained_ckpt_path: b.pth}\n"),
                 "model_growth.pretrained_ckpt_path", "model.load_from are both set"));
}

TEST_CASE("upstream's ControlNet YAMLs load: the preset and its control signal", "[config][upstream][controlnet]") {
  for (const char* name : {"controlnet/Sana_600M_img1024_controlnet.yaml", "controlnet/Sana_1600M_1024px_controlnet_bf16.yaml"}) {
    INFO(name);
    const Config c = load_config({upstream_yaml(name)}, {}, no_paths());
    CHECK(c.controlnet.control_signal_type == ControlSignal::scribble);
    CHECK(sana::train::model_spec_for(c).control_blocks == 7);  // upstream's copy_blocks_num
    CHECK(noted(c, "data.type"));  // SanaWebDatasetMSControl: the dataset kind follows data_dir
  }
}

TEST_CASE("SANA-Sprint's teacher fine-tune: the model divides its timestep by 1000", "[config][upstream]") {
  const Config c = load_config({upstream_yaml("sana_sprint_1024ms/SanaSprint_1600M_img1024_bf16_normT_allqknorm_teacher_ft.yaml")},
                               {}, no_paths());
  CHECK(c.scheduler.timestep_norm_scale_factor == 1000.0);
  CHECK(c.model.qk_norm);
  CHECK(c.model.cross_norm);
  CHECK_FALSE(noted(c, "timestep_norm_scale_factor"));  // it acts: no "no effect" note
  const auto spec = sana::train::model_spec_for(c);
  CHECK(spec.timestep_norm_scale == 1000.0);
  CHECK(spec.name == "SanaMS_1600M_P1_D20");
}

TEST_CASE("SANA-Sprint's stage-2 YAMLs: their keys reach the student, the teacher, the heads and the step",
          "[config][upstream]") {
  const Config c = load_config({upstream_yaml("sana_sprint_1024ms/SanaSprint_1600M_1024px_allqknorm_bf16_scm_ladd.yaml")},
                               {}, no_paths());
  const auto spec = sana::train::model_spec_for(c);
  CHECK(spec.trigflow);
  CHECK(spec.cfg_embed);
  CHECK(spec.cfg_embed_scale == 0.1);
  CHECK(spec.logvar);
  CHECK(spec.qk_norm);
  CHECK(spec.timestep_norm_scale == 1000.0);
  const auto teacher = sana::train::teacher_spec_for(c);
  CHECK(teacher.depth == 20);
  CHECK_FALSE(teacher.cfg_embed);
  CHECK_FALSE(teacher.logvar);
  CHECK(sana::train::head_blocks_for(c) == std::vector<int64_t>{2, 8, 14, 19});
  CHECK(c.scheduler.sprint.sigma_data == 0.5);
  CHECK(c.train.sprint.tangent_warmup_steps == 4000);
  CHECK(c.train.sprint.scm_cfg_scale == std::vector<double>{4.0, 4.5, 5.0});
  CHECK(c.scheduler.sprint.logit_mean_discriminator == -0.6);
  CHECK(c.train.sprint.train_largest_timestep);
  CHECK(c.train.sprint.adv_lambda == 0.5);
  CHECK(c.train.sprint.misaligned_pairs_D);
  CHECK(c.train.sprint.discriminator_loss == "hinge");
  CHECK(c.scheduler.vis_sampler == "scm");
  CHECK(noted(c, "train.optimizer_D"));  // accepted with no effect, as upstream never reads it
}
