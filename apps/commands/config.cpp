// The config on the command line: --config FILE with --key.path=VALUE overrides, loaded
// and validated before anything starts; `--print-config` and `--list-keys`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "command.h"
#include "sana/config/schema.h"
#include "sana/distributed/startup_failure.h"
#include "sana/util/log.h"

namespace sana::app {

ConfigSubcommand::ConfigSubcommand(CLI::App& app, const char* name, const char* description,
                                   ConfigNeeds needs)
    : cli_(app.add_subcommand(name, description)), needs_(needs) {
  cli_->allow_extras();  // the overrides
  auto* option = cli_->add_option("-c,--config", config_path_,
                                  needs.required ? "YAML config file" : "optional config (its dist section is used)");
  if (needs.required) option->required();
}

config::ValidationContext ConfigSubcommand::validation(const dist::LaunchEnv& env) const {
  auto ctx = ConfigCommand::validation(env);
  ctx.check_paths = needs_.data;
  ctx.check_batch = needs_.data;
  return ctx;
}

void add_top_level_options(CLI::App& app, TopLevelOptions& top) {
  app.allow_extras();  // training's overrides
  app.add_option("-c,--config", top.config_path, "YAML config file (its base: files load first)");
  app.add_flag("--print-config", top.print_config, "print the fully resolved config as YAML and exit");
  app.add_flag("--list-keys", top.list_keys, "list every config key and exit");
}

config::Config load_config(const ConfigCommand& command, const dist::LaunchEnv& env) {
  std::vector<config::ConfigIssue> cli_issues;
  const auto overrides = config::parse_overrides(command.overrides(), cli_issues);
  std::vector<std::string> files;
  if (!command.config_file().empty()) files.push_back(command.config_file());
  try {
    auto cfg = config::load_config(files, overrides, command.validation(env), std::move(cli_issues));
    // --print-config writes them as comments of its YAML instead.
    if (env.rank == 0 && !command.prints_config()) {
      for (const auto& note : cfg.load_notes) log::info("config: {}", note);
    }
    return cfg;
  } catch (const config::ConfigError& e) {
    // The other ranks would wait for this one until dist.timeout_s: tell them now.
    dist::report_startup_failure(env, "", 0, e.issues().front().format());
    throw;
  }
}

namespace {

class ListKeys : public PlainCommand {
 public:
  explicit ListKeys(const TopLevelOptions& top) : top_(top) {}
  bool chosen() const override { return top_.list_keys; }
  int run() override {
    config::Config defaults;
    config::resolve_defaults(defaults);
    for (const auto& f : config::fields_of(defaults)) {
      std::string line = fmt::format("{:<40} {:<17} {:<24} {}", f.key, config::type_name(f.ref),
                                     config::value_text(f.ref), f.help);
      if (!f.choices.empty()) line += fmt::format(" [{}]", fmt::join(f.choices, "|"));
      std::cout << line << "\n";
    }
    return 0;
  }

 private:
  const TopLevelOptions& top_;
};

// Without --config it prints the defaults. Paths are not checked: nothing is read.
class PrintConfig : public ConfigCommand {
 public:
  PrintConfig(CLI::App& app, const TopLevelOptions& top) : app_(app), top_(top) {}
  bool chosen() const override { return top_.print_config; }
  bool prints_config() const override { return true; }
  std::string config_file() const override { return top_.config_path; }
  std::vector<std::string> overrides() const override { return app_.remaining(); }
  config::ValidationContext validation(const dist::LaunchEnv& env) const override {
    auto ctx = ConfigCommand::validation(env);
    ctx.check_paths = false;
    return ctx;
  }
  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    std::cout << config::to_yaml(cfg);
    return 0;
  }

 private:
  CLI::App& app_;
  const TopLevelOptions& top_;
};

}  // namespace

std::unique_ptr<PlainCommand> list_keys_command(const TopLevelOptions& top) {
  return std::make_unique<ListKeys>(top);
}

std::unique_ptr<ConfigCommand> print_config_command(CLI::App& app, const TopLevelOptions& top) {
  return std::make_unique<PrintConfig>(app, top);
}

}  // namespace sana::app
