// A sana-train command: it registers its CLI11 options, runs by calling library code, and
// prints what the user sees. Failures are thrown (sana/util/error.h); main turns them into
// the message and the exit code in one place. Commands come in two kinds:
// - PlainCommand: needs neither the launch environment nor a config (launch, index,
//   inspect, report, --list-keys); runs as soon as the command line is parsed.
// - ConfigCommand: runs with the launch environment and the resolved, validated config
//   (train, check-dist, plan, check-data, model, preview, prepare-features, --print-config).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "sana/config/config.h"
#include "sana/config/loader.h"
#include "sana/distributed/launch_env.h"
#include "sana/train/test_hooks.h"

namespace sana::app {

class PlainCommand {
 public:
  virtual ~PlainCommand() = default;
  virtual bool chosen() const = 0;  // by the parsed command line
  virtual int run() = 0;            // the exit code: 0, or a deliberate failure
};

// A subcommand that reads no config. It takes no overrides, so an unknown word is an error.
class PlainSubcommand : public PlainCommand {
 public:
  PlainSubcommand(CLI::App& app, const char* name, const char* description)
      : cli_(app.add_subcommand(name, description)) {
    cli_->allow_extras(false);
  }
  bool chosen() const override { return cli_->parsed(); }

 protected:
  CLI::App* cli_;
};

class ConfigCommand {
 public:
  virtual ~ConfigCommand() = default;
  virtual bool chosen() const = 0;
  // The YAML file ("" only where the command works from the defaults).
  virtual std::string config_file() const = 0;
  // The command-line words that are --key.path=VALUE overrides.
  virtual std::vector<std::string> overrides() const = 0;
  // What validation may assume; by default every check, for the launch environment's world.
  virtual config::ValidationContext validation(const dist::LaunchEnv& env) const {
    config::ValidationContext ctx;
    ctx.world_size = env.world_size;
    return ctx;
  }
  virtual int run(const dist::LaunchEnv& env, const config::Config& cfg) = 0;
  // Whether it prints the config itself (with its load notes as comments) instead of logging them.
  virtual bool prints_config() const { return false; }
};

// What a subcommand does with its config.
struct ConfigNeeds {
  bool required = true;  // --config must be given (check-dist works without one)
  bool data = true;      // reads the data and sizes batches: paths and batch sizes checked
};

// A subcommand that reads a config: `NAME --config FILE [--key.path=VALUE]... [its options]`.
class ConfigSubcommand : public ConfigCommand {
 public:
  ConfigSubcommand(CLI::App& app, const char* name, const char* description, ConfigNeeds needs = {});
  bool chosen() const override { return cli_->parsed(); }
  std::string config_file() const override { return config_path_; }
  std::vector<std::string> overrides() const override { return cli_->remaining(); }
  config::ValidationContext validation(const dist::LaunchEnv& env) const override;

 protected:
  CLI::App* cli_;
  std::string config_path_;
  ConfigNeeds needs_;
};

// The top level's own options: --config FILE (training and --print-config),
// --print-config and --list-keys (apps/commands/config.cpp).
struct TopLevelOptions {
  std::string config_path;
  bool print_config = false;
  bool list_keys = false;
};
void add_top_level_options(CLI::App& app, TopLevelOptions& top);

// The command's config: its file and overrides, validated as the command asks. A config
// error is also posted to the other ranks (they would wait for this one) and rethrown.
config::Config load_config(const ConfigCommand& command, const dist::LaunchEnv& env);

// The rank's log file in work_dir (<stem>.log on rank 0, <stem>.rank<N>.log elsewhere).
// With log_console: rank0 (the default) ranks other than 0 show only warnings and errors
// on the terminal, under any launcher: one progress line per interval, not one per rank.
void open_run_log(const config::Config& cfg, const dist::LaunchEnv& env, const std::string& stem);

// What `sana-train launch` needs besides its options.
struct LaunchArgs {
  std::vector<std::string> worker_args;  // the words after "--"
  std::string self;                      // this executable, to run sana-train workers
};

// One factory per command file. `top`, `launch` and `hooks` (the tests' fault injection,
// read once by main()) must outlive the commands.
std::unique_ptr<PlainCommand> launch_command(CLI::App& app, const LaunchArgs& launch, const train::TestHooks& hooks);
std::unique_ptr<PlainCommand> index_command(CLI::App& app);
std::unique_ptr<PlainCommand> inspect_command(CLI::App& app);
std::unique_ptr<PlainCommand> report_command(CLI::App& app);
std::unique_ptr<PlainCommand> list_keys_command(const TopLevelOptions& top);
std::unique_ptr<ConfigCommand> check_dist_command(CLI::App& app, const train::TestHooks& hooks);
std::unique_ptr<ConfigCommand> plan_command(CLI::App& app);
std::unique_ptr<ConfigCommand> check_data_command(CLI::App& app);
std::unique_ptr<ConfigCommand> model_command(CLI::App& app);
std::unique_ptr<ConfigCommand> preview_command(CLI::App& app);
std::unique_ptr<ConfigCommand> export_command(CLI::App& app);
std::unique_ptr<ConfigCommand> prepare_features_command(CLI::App& app, const train::TestHooks& hooks);
std::unique_ptr<ConfigCommand> print_config_command(CLI::App& app, const TopLevelOptions& top);
std::unique_ptr<ConfigCommand> train_command(CLI::App& app, const TopLevelOptions& top, const train::TestHooks& hooks);

}  // namespace sana::app
