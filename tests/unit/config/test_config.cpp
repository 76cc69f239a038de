// The config as a user meets it: defaults, every override form, base-file inheritance,
// the --print-config round trip, and error reports that name the key.
#include "catch.h"

#include "config_test_support.h"
#include "sana/config/schema.h"


TEST_CASE("defaults follow upstream Sana where the concept is the same", "[config]") {
  TempDir dir;
  const Config c = load_text(dir, "");
  CHECK(c.train.optimizer.type == OptimizerType::AdamW);
  CHECK(c.train.optimizer.lr == 1e-4);
  CHECK(c.train.optimizer.weight_decay == 0.03);
  CHECK(c.train.optimizer.eps == std::vector<double>{1e-10});
  CHECK(c.train.optimizer.betas == std::vector<double>{0.9, 0.999});
  CHECK(c.train.lr_schedule == LrSchedule::constant);
  CHECK(c.train.lr_schedule_args.num_warmup_steps == 500);
  CHECK(c.train.log_interval == 50);
  CHECK(c.scheduler.weighting_scheme == Weighting::logit_normal);
  CHECK(c.scheduler.logit_std == 1.0);
  CHECK(c.model.model == "SanaMS_600M_P1_D28");
  CHECK(c.model.linear_head_dim == 32);
  CHECK(c.model.mlp_ratio == 2.5);
  CHECK(c.dist.timeout_s >= 60);  // minutes, not c10d's 30 min and not seconds
  CHECK(accumulation_steps(c.train, 1) == 8);
  // Upstream's dataclass defaults (diffusion/utils/config.py) where ours once differed.
  CHECK(c.model.mixed_precision == Precision::fp16);
  CHECK(c.model.class_dropout_prob == 0.0);
  CHECK(c.text_encoder.y_norm_scale_factor == 1.0);
  CHECK(c.scheduler.vis_sampler == "flow_dpm-solver");
  CHECK(c.scheduler.timestep_grid == TimestepGrid::integer);
  CHECK(c.train.auto_lr == AutoLr::sqrt);
  CHECK_FALSE(c.train.ema_update);
  CHECK_FALSE(ema_enabled(c.train));
  CHECK(c.train.ema_rate == 0.9999);
  CHECK(c.train.eval_sampling_steps == 250);
  CHECK(c.train.validation_prompts.size() == 5);
}

TEST_CASE("CAME gets upstream's betas and eps unless the config gives them", "[config]") {
  TempDir dir;
  const Config c = load_text(dir, "train:\n  optimizer:\n    type: CAME\n");
  CHECK(c.train.optimizer.betas == std::vector<double>{0.9, 0.999, 0.9999});
  CHECK(c.train.optimizer.eps == std::vector<double>{1e-30, 1e-16});
}

TEST_CASE("every override form reaches the typed config", "[config][overrides]") {
  TempDir dir;
  const std::string yaml = "train:\n  seed: 1\n  optimizer:\n    lr: 0.5\n";

  SECTION("--key=value") {
    CHECK(load_text(dir, yaml, {"--train.seed=7"}).train.seed == 7);
  }
  SECTION("--key value") {
    CHECK(load_text(dir, yaml, {"--train.seed", "7"}).train.seed == 7);
  }
  SECTION("negative numbers as separate words") {
    CHECK(load_text(dir, yaml, {"--scheduler.logit_mean", "-0.5"}).scheduler.logit_mean == -0.5);
  }
  SECTION("scientific notation") {
    CHECK(load_text(dir, yaml, {"--train.optimizer.lr=2e-5"}).train.optimizer.lr == 2e-5);
  }
  SECTION("top-level keys") {
    CHECK(load_text(dir, yaml, {"--resume_from=latest"}).resume_from == "latest");
    CHECK(load_text(dir, yaml, {"--work_dir", "out/x"}).work_dir == "out/x");
  }
  SECTION("booleans in YAML spellings") {
    CHECK(load_text(dir, yaml, {"--data.random_flip=true"}).data.random_flip);
    CHECK(load_text(dir, yaml, {"--data.random_flip=yes"}).data.random_flip);
    CHECK_FALSE(load_text(dir, yaml, {"--model.qk_norm=False"}).model.qk_norm);
  }
  SECTION("lists in flow syntax, and a single value as a list of one") {
    CHECK(load_text(dir, yaml, {"--data.data_dir=[a, b]"}).data.data_dir ==
          std::vector<std::string>{"a", "b"});
    CHECK(load_text(dir, yaml, {"--data.data_dir", "only"}).data.data_dir ==
          std::vector<std::string>{"only"});
    CHECK(load_text(dir, yaml, {"--data.multi_scale_sizes=[256,512]"}).data.multi_scale_sizes ==
          std::vector<int64_t>{256, 512});
  }
  SECTION("a mapping sets several keys of a section") {
    const Config c = load_text(dir, yaml, {"--train.optimizer={type: CAME, lr: 3e-4}"});
    CHECK(c.train.optimizer.type == OptimizerType::CAME);
    CHECK(c.train.optimizer.lr == 3e-4);
  }
  SECTION("strings keep spaces and can be quoted") {
    CHECK(load_text(dir, yaml, {"--work_dir=my run"}).work_dir == "my run");
    CHECK(load_text(dir, yaml, {"--work_dir='123'"}).work_dir == "123");
  }
  SECTION("the last override of a key wins, and overrides beat the file") {
    const Config c = load_text(dir, yaml, {"--train.seed=2", "--train.seed", "3"});
    CHECK(c.train.seed == 3);
    CHECK(c.train.optimizer.lr == 0.5);  // untouched keys keep the file's value
  }
  SECTION("null clears an optional string") {
    CHECK(load_text(dir, "resume_from: latest\n", {"--resume_from=null"}).resume_from.empty());
  }
}

TEST_CASE("a mapping of weights replaces the default, entry by entry after that", "[config]") {
  TempDir dir;
  CHECK(load_text(dir, "").data.caption_proportion == NamedWeights{{"prompt", 1.0}});
  const std::string yaml = "data:\n  caption_proportion:\n    VILA: 2\n    prompt: 1\n";
  CHECK(load_text(dir, yaml).data.caption_proportion == NamedWeights{{"VILA", 2.0}, {"prompt", 1.0}});
  CHECK(load_text(dir, yaml, {"--data.caption_proportion.prompt=3"}).data.caption_proportion ==
        NamedWeights{{"VILA", 2.0}, {"prompt", 3.0}});
  CHECK(load_text(dir, "data:\n  caption_proportion: {}\n").data.caption_proportion.empty());
  CHECK_THROWS_WITH(load_text(dir, "data:\n  caption_proportion:\n    VILA: lots\n"),
                    Catch::Contains("data.caption_proportion.VILA") && Catch::Contains("expected a number"));
  CHECK_THROWS_WITH(load_text(dir, "data:\n  caption_proportion:\n    VILA: -1\n"),
                    Catch::Contains("data.caption_proportion"));
}

TEST_CASE("base: files load first and later values override earlier ones", "[config][base]") {
  TempDir dir;
  dir.write("common/root.yaml",
            "work_dir: from_root\ntrain:\n  seed: 1\n  num_epochs: 5\n  optimizer:\n    lr: 0.1\n");
  dir.write("common/mid.yaml", "base: root.yaml\ntrain:\n  seed: 2\n  optimizer:\n    type: CAME\n");
  dir.write("other.yaml", "train:\n  log_interval: 7\n  seed: 3\n");

  SECTION("a chain of bases, relative to the file that names them") {
    const Config c = load_text(dir, "base: common/mid.yaml\ntrain:\n  num_epochs: 9\n");
    CHECK(c.work_dir == "from_root");      // only in the root
    CHECK(c.train.seed == 2);              // mid overrides root
    CHECK(c.train.num_epochs == 9);        // the file overrides both
    CHECK(c.train.optimizer.type == OptimizerType::CAME);
    CHECK(c.train.optimizer.lr == 0.1);    // nested keys merge, not replace
  }
  SECTION("a list of bases applies in order") {
    const Config c = load_text(dir, "base: [common/mid.yaml, other.yaml]\n");
    CHECK(c.train.seed == 3);
    CHECK(c.train.log_interval == 7);
    CHECK(c.train.num_epochs == 5);
  }
  SECTION("command-line overrides beat every file") {
    CHECK(load_text(dir, "base: common/mid.yaml\n", {"--train.seed=11"}).train.seed == 11);
  }
  SECTION("a missing base names the file and the line that asked for it") {
    const auto issues = issues_of(dir, "train:\n  seed: 1\nbase: nope.yaml\n");
    REQUIRE(issues.size() == 1);
    CHECK(issues[0].key == "base");
    CHECK(issues[0].format().find("nope.yaml' not found") != std::string::npos);
    CHECK(issues[0].origin.line == 3);
  }
  SECTION("a cycle is an error, not a hang") {
    dir.write("a.yaml", "base: b.yaml\n");
    dir.write("b.yaml", "base: a.yaml\n");
    const auto issues = issues_of(dir, "base: a.yaml\n");
    CHECK(mentions(issues, "base", "includes itself"));
  }
}

TEST_CASE("print-config output loads back to the same config", "[config][print]") {
  TempDir dir;
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"--train.optimizer.type=CAME", "--train.optimizer.lr=3.3e-5", "--scheduler.flow_shift=3"},
      {"--data.data_dir=[a b, 'c:d', \"#e\", null-ish, 'true', '']", "--work_dir=a \"quoted\" dir"},
      {"--data.multi_scale_sizes=[256, 1024]", "--train.validation_prompts=[a cat, 'x: y']",
       "--scheduler.logit_mean=-0.123456789012345", "--train.max_steps=123456789012"},
      {"--data.caption_proportion={prompt: 1, VILA1.5-13B: 2.5, 'x: y': 0}"},
  };
  for (const auto& args : variants) {
    const Config first = load_text(dir, "", args);
    const std::string printed = to_yaml(first);
    const Config second = load_config({dir.write("printed.yaml", printed)}, {}, no_paths());
    INFO(printed);
    CHECK(to_yaml(second) == printed);
    Config a = first, b = second;
    const auto fa = fields_of(a), fb = fields_of(b);
    for (size_t i = 0; i < fa.size(); ++i) {
      INFO(fa[i].key);
      CHECK(value_text(fa[i].ref) == value_text(fb[i].ref));
    }
  }
  const Config weights = load_text(dir, "", variants[4]);
  CHECK(weights.data.caption_proportion ==
        NamedWeights{{"prompt", 1.0}, {"VILA1.5-13B", 2.5}, {"x: y", 0.0}});
  const Config odd = load_text(dir, "", variants[2]);
  CHECK(odd.data.data_dir == std::vector<std::string>{"a b", "c:d", "#e", "null-ish", "true", ""});
  CHECK(odd.work_dir == "a \"quoted\" dir");
}

TEST_CASE("every name of every enumerated option loads, prints back, and nothing else loads", "[config][choices]") {
  TempDir dir;
  Config defaults;
  int enums = 0, names = 0;
  for (const auto& f : fields_of(defaults)) {
    const auto* choice = std::get_if<ChoiceRef>(&f.ref);
    if (choice == nullptr) continue;
    ++enums;
    INFO(f.key);
    CHECK(f.choices == choice->names);
    CHECK(type_name(f.ref) == "string");
    for (const auto& name : choice->names) {
      ++names;
      std::vector<std::string> args = {"--" + f.key + "=" + name, "--train.optimizer.betas=[0.9, 0.99, 0.999]",
                                       "--train.optimizer.eps=[1e-30, 1e-16]", "--train.optimizer.type=CAME",
                                       "--vae.vae_pretrained=vae.pt", "--text_encoder.text_encoder_path=text.pt"};
      // SANA-Sprint's TrigFlow times are a student's (a SanaMSCM preset) only.
      if (name == "logit_normal_trigflow") {
        args.insert(args.end(), {"--model.model=SanaMSCM_600M_P1_D28", "--text_encoder.text_encoder_name=torchscript"});
      }
      Config c = load_text(dir, "", args);
      if (f.key == "train.optimizer.type") continue;  // set again by the last override
      for (const auto& g : fields_of(c)) {
        if (g.key == f.key) CHECK(value_text(g.ref) == "\"" + name + "\"");
      }
    }
    const auto issues = issues_of(dir, "", {"--" + f.key + "=" + choice->names.front() + "x"});
    CHECK(mentions(issues, f.key, "is not one of: "));
    CHECK(mentions(issues, f.key, "did you mean " + choice->names.front() + "?"));
    CHECK(mentions(issues, f.key, "command line"));
  }
  CHECK(enums >= 12);
  CHECK(names >= 2 * enums);
  // No value names no choice; a non-scalar is a type error, as for any string.
  CHECK(mentions(issues_of(dir, "", {"--train.lr_schedule=null"}), "train.lr_schedule",
                 "'' is not one of: constant, cosine"));
  CHECK(mentions(issues_of(dir, "train:\n  lr_schedule: [constant]\n"), "train.lr_schedule", "expected string"));
}

TEST_CASE("the shipped configs load and print", "[config][print]") {
  for (const char* name : {"sana_tiny_cpu.yaml", "Sana_600M_img512.yaml", "Sana_1600M_img1024.yaml",
                           "Sana_600M_img512_lora.yaml", "Sana_1600M_img1024_lora.yaml",
                           "Sana_1600M_img1024_controlnet.yaml"}) {
    INFO(name);
    const Config c = load_config({std::string(SANA_SOURCE_DIR) + "/configs/" + name}, {}, no_paths());
    CHECK_FALSE(to_yaml(c).empty());
  }
  const Config big =
      load_config({std::string(SANA_SOURCE_DIR) + "/configs/Sana_1600M_img1024.yaml"}, {}, no_paths());
  CHECK(big.model.model == "SanaMS_1600M_P1_D20");
  CHECK(big.train.optimizer.type == OptimizerType::CAME);  // inherited from the 600M config
  CHECK(big.data.aspect_ratio_type == "ASPECT_RATIO_1024");
  const Config control =
      load_config({std::string(SANA_SOURCE_DIR) + "/configs/Sana_1600M_img1024_controlnet.yaml"}, {}, no_paths());
  CHECK(control.model.model == "SanaMSControlNet_1600M_P1_D20");
  CHECK(control.controlnet.control_signal_type == ControlSignal::canny);
}

TEST_CASE("errors name the key, the file position and what to do", "[config][errors]") {
  TempDir dir;
  SECTION("unknown keys suggest the closest known key") {
    auto issues = issues_of(dir, "train:\n  optimizer:\n    weight_decy: 0.1\n");
    CHECK(mentions(issues, "train.optimizer.weight_decy", "did you mean train.optimizer.weight_decay?"));
    CHECK(issues[0].origin.line == 3);
    CHECK(issues[0].origin.column == 5);
  }
  SECTION("a key in the wrong section points at the right one") {
    auto issues = issues_of(dir, "model:\n  log_level: debug\n");
    CHECK(mentions(issues, "model.log_level", "did you mean log_level?"));
  }
  SECTION("a misspelt section is one error, not one per key") {
    auto issues = issues_of(dir, "trian:\n  seed: 1\n  num_epochs: 2\n  log_interval: 3\n");
    REQUIRE(issues.size() == 1);
    CHECK(mentions(issues, "trian", "unknown section"));
    CHECK(mentions(issues, "trian", "did you mean train?"));
  }
  SECTION("type errors point at the value") {
    auto issues = issues_of(dir, "train:\n  seed:   abc\n");
    CHECK(mentions(issues, "train.seed", "expected integer, got \"abc\""));
    CHECK(issues[0].origin.line == 2);
    CHECK(issues[0].origin.column == 11);
  }
  SECTION("all errors are reported at once") {
    auto issues = issues_of(dir, "train:\n  seed: x\n  log_interval: 0\nmodel:\n  modle: y\n",
                            {"--train.optimizer.lr=-1"});
    CHECK(issues.size() == 4);
    CHECK(mentions(issues, "train.seed", "expected integer"));
    CHECK(mentions(issues, "train.log_interval", "out of range"));
    CHECK(mentions(issues, "model.modle", "did you mean model.model?"));
    CHECK(mentions(issues, "train.optimizer.lr", "command line '--train.optimizer.lr=-1'"));
  }
  SECTION("choices suggest the closest value") {
    auto issues = issues_of(dir, "scheduler:\n  weighting_scheme: logit-normal\n");
    CHECK(mentions(issues, "scheduler.weighting_scheme", "did you mean logit_normal?"));
  }
  SECTION("override words that are not --key forms") {
    std::vector<ConfigIssue> issues;
    parse_overrides({"train.seed=3", "--train.seed"}, issues);
    REQUIRE(issues.size() == 2);
    CHECK(issues[0].format().find("unexpected argument 'train.seed=3'") != std::string::npos);
    CHECK(issues[1].key == "train.seed");
    CHECK(issues[1].message == "has no value");
  }
}

TEST_CASE("any world size up to the global batch fits the batch sizes", "[config][batch]") {
  TempDir dir;
  const std::string yaml = "train:\n  global_batch_size: 24\n  micro_batch_size: 4\n";
  for (int w : {1, 4, 5, 7, 24}) CHECK_NOTHROW(load_text(dir, yaml, {}, no_paths(w)));
  auto issues = issues_of(dir, yaml, {}, no_paths(25));
  CHECK(mentions(issues, "train.global_batch_size", "24 is smaller than the world size 25"));
  // The last micro-batch of a share may be smaller: 10 on 1 process is 4 + 4 + 2.
  CHECK_NOTHROW(load_text(dir, "train:\n  global_batch_size: 10\n  micro_batch_size: 4\n"));
}

TEST_CASE("micro_batch_size takes a number or auto, and prints back as given", "[config][batch]") {
  TempDir dir;
  const Config a = load_text(dir, "train:\n  micro_batch_size: auto\n  micro_batch_memory_gib: 24\n");
  CHECK(a.train.micro_batch_auto);
  CHECK(a.train.micro_batch_memory_gib == 24.0);
  const std::string printed = to_yaml(a);
  CHECK_THAT(printed, Catch::Contains("  micro_batch_size: auto  #"));
  const Config back = load_config({dir.write("printed.yaml", printed)}, {}, no_paths());
  CHECK(back.train.micro_batch_auto);
  CHECK(to_yaml(back) == printed);
  // A number after auto (a later layer, the command line) is a number again.
  const Config n = load_text(dir, "train:\n  micro_batch_size: AUTO\n", {"--train.micro_batch_size=8"});
  CHECK_FALSE(n.train.micro_batch_auto);
  CHECK(n.train.micro_batch_size == 8);
  CHECK_THAT(to_yaml(n), Catch::Contains("  micro_batch_size: 8  #"));
  // The bounds hold for numbers; another word names both forms.
  CHECK(mentions(issues_of(dir, "train:\n  micro_batch_size: 0\n"), "train.micro_batch_size",
                 "0 is out of range: must be >= 1 or auto"));
  CHECK(mentions(issues_of(dir, "train:\n  micro_batch_size: most\n"), "train.micro_batch_size",
                 "expected integer or auto"));
  // train.deterministic's sums hold at one micro-batch size: auto's follows the device.
  const auto det = issues_of(dir, "train:\n  micro_batch_size: auto\n  deterministic: true\n");
  CHECK(mentions(det, "train.micro_batch_size", "auto with train.deterministic"));
  CHECK(mentions(det, "train.micro_batch_size", "give a number"));
}

TEST_CASE("working_weights: auto keeps the half copies unless the optimizer is offloaded", "[config]") {
  TempDir dir;
  CHECK(working_weights_on(load_text(dir, "").train));
  CHECK_FALSE(working_weights_on(load_text(dir, "train:\n  offload_optimizer: true\n").train));
  // A YAML boolean is the choice of that name, and wins over auto's rule either way.
  CHECK(working_weights_on(load_text(dir, "train:\n  offload_optimizer: true\n  working_weights: true\n").train));
  CHECK_FALSE(working_weights_on(load_text(dir, "train:\n  working_weights: false\n").train));
  CHECK_FALSE(working_weights_on(load_text(dir, "", {"--train.working_weights=false"}).train));
  const Config back = load_text(dir, to_yaml(load_text(dir, "train:\n  working_weights: false\n")));
  CHECK(back.train.working_weights == WorkingWeights::off);
}

TEST_CASE("paths are checked only when the run will read them", "[config][paths]") {
  TempDir dir;
  const std::string yaml = "data:\n  data_dir: [" + dir.path() + "]\nmodel:\n  load_from: " +
                           dir.path("missing.pth") + "\n";
  CHECK_NOTHROW(load_text(dir, yaml));  // --print-config does not touch the disk
  auto issues = issues_of(dir, yaml, {}, ValidationContext{1, true});
  REQUIRE(issues.size() == 1);
  CHECK(mentions(issues, "model.load_from", "missing.pth' does not exist"));
  issues = issues_of(dir, "train:\n  seed: 1\n", {}, ValidationContext{1, true});
  CHECK(mentions(issues, "data.data_dir", "is required"));
}

TEST_CASE("did-you-mean stays quiet when nothing is close", "[config][errors]") {
  const std::vector<std::string> known = {"train.seed", "train.num_epochs", "work_dir"};
  CHECK(suggest_key("train.sede", known) == "train.seed");
  CHECK(suggest_key("wrok_dir", known) == "work_dir");
  CHECK(suggest_key("completely.different", known).empty());
}
