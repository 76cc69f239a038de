// sana-train: the command line. Reads as the table of contents of a run:
// command line -> launch environment -> config (validated before anything else) ->
// logging -> training. Exit codes: 0 done, 1 the run failed, 2 usage or config error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "sana/config/loader.h"
#include "sana/config/schema.h"
#include "sana/dist/launch_env.h"
#include "sana/train/interim_trainer.h"
#include "sana/util/log.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// ---------------------------------------------------------------------------------------
// Help

std::string help_footer() {
  sana::config::Config defaults;
  std::string out =
      "\nCommands:\n"
      "  sana-train --config FILE [--key.path=VALUE | --key.path VALUE]...   train\n"
      "  sana-train --config FILE --print-config    print the resolved config as YAML\n"
      "  sana-train --list-keys                     every config key with type and default\n"
      "\nMost used keys (override any key of the YAML the same way):\n";
  for (const auto& f : sana::config::fields_of(defaults)) {
    if (!f.common) continue;
    out += fmt::format("  --{:<34} {} (default {})\n", f.key, f.help,
                       sana::config::value_text(f.ref));
  }
  out +=
      "\nExamples:\n"
      "  sana-train --config configs/sana_tiny_cpu.yaml --train.max_steps=20\n"
      "  sana-train --config configs/Sana_600M_img512.yaml --train.optimizer.lr 2e-5 "
      "--resume_from=latest\n";
  return out;
}

void print_keys() {
  sana::config::Config defaults;
  sana::config::resolve_defaults(defaults);
  for (const auto& f : sana::config::fields_of(defaults)) {
    std::string line = fmt::format("{:<40} {:<17} {:<24} {}", f.key,
                                   sana::config::type_name(f.ref),
                                   sana::config::value_text(f.ref), f.help);
    if (!f.choices.empty()) line += fmt::format(" [{}]", fmt::join(f.choices, "|"));
    std::cout << line << "\n";
  }
}

// ---------------------------------------------------------------------------------------
// Config

sana::config::Config load(const std::string& path, const std::vector<std::string>& extras,
                          const sana::config::ValidationContext& ctx) {
  sana::config::ConfigLoader loader;
  std::vector<sana::config::ConfigIssue> cli_issues;
  const auto overrides = sana::config::parse_overrides(extras, cli_issues);
  for (auto& issue : cli_issues) loader.add_issue(std::move(issue));
  if (!path.empty()) loader.add_file(path);
  for (const auto& o : overrides) loader.add_override(o);
  return loader.build(ctx);
}

// ---------------------------------------------------------------------------------------
// Training

int train(const sana::config::Config& cfg, const sana::dist::LaunchEnv& env) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.work_dir, ec);
  if (ec) {
    sana::log::error("cannot create work_dir '{}': {}", cfg.work_dir, ec.message());
    return kExitFailure;
  }
  const std::string log_name =
      env.rank == 0 ? "train.log" : fmt::format("train.rank{}.log", env.rank);
  std::string err;
  if (!sana::log::open_file((fs::path(cfg.work_dir) / log_name).string(), &err)) {
    sana::log::error("{}", err);
    return kExitFailure;
  }
  if (env.rank == 0) {
    std::ofstream(fs::path(cfg.work_dir) / "config.yaml") << sana::config::to_yaml(cfg);
  }
  sana::log::info("sana-train: launcher {}, rank {} of {}, work_dir {}", env.launcher, env.rank,
                  env.world_size, cfg.work_dir);

  const auto result = sana::train::run_interim_training(cfg);
  sana::log::info("done: {} steps on {} images in {:.1f} s; loss {:.4f} (first interval) -> "
                  "{:.4f} (last interval)",
                  result.steps, result.images, result.seconds, result.first_loss,
                  result.last_loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --- Command line -------------------------------------------------------------------
  CLI::App app{"sana-train: train Sana-style multi-scale linear diffusion transformers"};
  app.allow_extras();
  app.footer(help_footer());
  std::string config_path;
  bool print_config = false;
  bool list_keys = false;
  app.add_option("-c,--config", config_path, "YAML config file (its base: files load first)");
  app.add_flag("--print-config", print_config, "print the fully resolved config as YAML and exit");
  app.add_flag("--list-keys", list_keys, "list every config key and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  if (list_keys) {
    print_keys();
    return 0;
  }

  // --- Launch environment -------------------------------------------------------------
  sana::dist::LaunchEnv env;
  try {
    env = sana::dist::detect_launch_env();
  } catch (const sana::dist::LaunchEnvError& e) {
    std::cerr << "launch error: " << e.what() << "\n";
    return kExitUsage;
  }
  sana::log::set_rank(env.rank, env.world_size);

  // --- Config: every mistake is reported here, before any process could wait ----------
  if (config_path.empty() && !print_config) {
    std::cerr << "usage error: --config FILE is required (sana-train --help)\n";
    return kExitUsage;
  }
  sana::config::Config cfg;
  try {
    cfg = load(config_path, app.remaining(), {env.world_size, /*check_paths=*/!print_config});
  } catch (const sana::config::ConfigError& e) {
    std::cerr << e.report(env.world_size > 1 ? fmt::format("[rank {}] ", env.rank) : "");
    return kExitUsage;
  }
  if (print_config) {
    std::cout << sana::config::to_yaml(cfg);
    return 0;
  }
  sana::log::set_level(*sana::log::parse_level(cfg.log_level));

  // --- Training -----------------------------------------------------------------------
  if (env.world_size > 1) {
    sana::log::error("world size {} from {}: multi-process training is not available in this "
                     "build yet; run one process",
                     env.world_size, env.launcher);
    return kExitUsage;
  }
  try {
    return train(cfg, env);
  } catch (const sana::train::UnsupportedByInterimTrainer& e) {
    sana::log::error("{}", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    sana::log::error("training failed: {}", e.what());
    return kExitFailure;
  }
}
