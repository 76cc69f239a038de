// `sana-train --config FILE [--key.path=VALUE]...`: training, on one process or on every
// process of a launcher (train/train.h runs it). Logs to work_dir/train.log (rank 0) or
// train.rank<N>.log, and keeps the resolved config as work_dir/config.yaml. With
// log_console: rank0 (the default), ranks other than 0 write only warnings and errors to
// the terminal, under any launcher: one progress line per interval, not one per rank.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "command.h"
#include "sana/train/train.h"
#include "sana/util/error.h"
#include "sana/util/log.h"
#include "sana/util/torch_build.h"

namespace sana::app {

namespace fs = std::filesystem;

void open_run_log(const config::Config& cfg, const dist::LaunchEnv& env, const std::string& stem) {
  std::error_code ec;
  fs::create_directories(cfg.work_dir, ec);
  if (ec) throw RunError(fmt::format("cannot create work_dir '{}': {}", cfg.work_dir, ec.message()));
  // A replacement for a lost rank (SANA_JOIN) logs under its own id, not the lost one's.
  const int id = env.join_id >= 0 ? env.join_id : env.rank;
  const std::string log_name = id == 0 ? stem + ".log" : fmt::format("{}.rank{}.log", stem, id);
  std::string err;
  if (!log::open_file((fs::path(cfg.work_dir) / log_name).string(), &err)) throw RunError(err);
  if (env.world_size > 1 && cfg.log_console == "rank0") {
    log::set_console_rank0_only(true);  // the group's rank 0, after a regroup too
    if (id > 0) log::set_console_level(log::Level::warn);
    log::info("the terminal shows rank 0's lines and every rank's warnings and errors; rank N's whole log is "
              "{} (log_console: all shows every rank's lines)",
              (fs::path(cfg.work_dir) / (stem + ".rank<N>.log")).string());
  }
}

namespace {

// The top level: chosen when no subcommand and no top-level action is.
class Train : public ConfigCommand {
 public:
  Train(CLI::App& app, const TopLevelOptions& top, const train::TestHooks& hooks)
      : app_(app), top_(top), hooks_(hooks) {}
  bool chosen() const override { return true; }
  std::string config_file() const override {
    if (top_.config_path.empty()) throw UsageError("--config FILE is required (sana-train --help)");
    return top_.config_path;
  }
  std::vector<std::string> overrides() const override { return app_.remaining(); }
  int run(const dist::LaunchEnv& env, const config::Config& cfg) override {
    open_run_log(cfg, env, "train");
    if (env.rank == 0) std::ofstream(fs::path(cfg.work_dir) / "config.yaml") << config::to_yaml(cfg);
    log::info("sana-train {} ({}): launcher {}, rank {} of {}, work_dir {}", SANA_VERSION,
              util::torch_build_summary(), env.launcher, env.rank, env.world_size, cfg.work_dir);
    return train::train(cfg, env, hooks_);
  }

 private:
  CLI::App& app_;
  const TopLevelOptions& top_;
  const train::TestHooks& hooks_;
};

}  // namespace

std::unique_ptr<ConfigCommand> train_command(CLI::App& app, const TopLevelOptions& top, const train::TestHooks& hooks) {
  return std::make_unique<Train>(app, top, hooks);
}

}  // namespace sana::app
