// `sana-train --config FILE [--key.path=VALUE]...`: training, on one process or on every
// process of a launcher (train/trainer.h runs it). Logs to work_dir/train.log (rank 0) or
// train.rank<N>.log, and keeps the resolved config as work_dir/config.yaml.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "command.h"
#include "sana/train/trainer.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::app {

namespace {

namespace fs = std::filesystem;

// The rank's log file in work_dir, and the resolved config next to it (rank 0).
void open_run_folder(const config::Config& cfg, const dist::LaunchEnv& env) {
  std::error_code ec;
  fs::create_directories(cfg.work_dir, ec);
  if (ec) throw RunError(fmt::format("cannot create work_dir '{}': {}", cfg.work_dir, ec.message()));
  const std::string log_name = env.rank == 0 ? "train.log" : fmt::format("train.rank{}.log", env.rank);
  std::string err;
  if (!log::open_file((fs::path(cfg.work_dir) / log_name).string(), &err)) throw RunError(err);
  if (env.rank == 0) std::ofstream(fs::path(cfg.work_dir) / "config.yaml") << config::to_yaml(cfg);
}

// The top level: chosen when no subcommand and no top-level action is.
class Train : public ConfigCommand {
 public:
  Train(CLI::App& app, const TopLevelOptions& top) : app_(app), top_(top) {}
  bool chosen() const override { return true; }
  std::string config_file() const override {
    if (top_.config_path.empty()) throw UsageError("--config FILE is required (sana-train --help)");
    return top_.config_path;
  }
  std::vector<std::string> overrides() const override { return app_.remaining(); }
  int run(const dist::LaunchEnv& env, const config::Config& cfg) override {
    open_run_folder(cfg, env);
    log::info("sana-train {}: launcher {}, rank {} of {}, work_dir {}", SANA_VERSION, env.launcher, env.rank,
              env.world_size, cfg.work_dir);
    return train::train(cfg, env);
  }

 private:
  CLI::App& app_;
  const TopLevelOptions& top_;
};

}  // namespace

std::unique_ptr<ConfigCommand> train_command(CLI::App& app, const TopLevelOptions& top) {
  return std::make_unique<Train>(app, top);
}

}  // namespace sana::app
