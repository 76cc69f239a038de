// `sana-train check-dist [--seconds S] [--config FILE] [--dist.KEY=VALUE]...`: the
// pre-flight check of a cluster (sana/distributed/check_dist.h does the work).
#include "command.h"
#include "sana/distributed/check_dist.h"

namespace sana::app {

namespace {

class CheckDist : public ConfigSubcommand {
 public:
  explicit CheckDist(CLI::App& app)
      : ConfigSubcommand(app, "check-dist", "pre-flight check: rendezvous, devices, agreement, all-reduce bandwidth",
                         {/*required=*/false, /*data=*/false}) {
    cli_->add_option("--seconds", opts_.soak_seconds, "keep all-reducing this many seconds after the table (a soak)");
  }
  int run(const dist::LaunchEnv& env, const config::Config& cfg) override {
    return dist::run_check_dist(cfg, env, opts_);
  }

 private:
  dist::CheckDistOptions opts_;
};

}  // namespace

std::unique_ptr<ConfigCommand> check_dist_command(CLI::App& app) { return std::make_unique<CheckDist>(app); }

}  // namespace sana::app
