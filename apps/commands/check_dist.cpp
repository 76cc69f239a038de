// `sana-train check-dist [--seconds S] [--config FILE] [--dist.KEY=VALUE]...`: the
// pre-flight check of a cluster (sana/distributed/check_dist.h does the work).
#include "command.h"
#include "sana/config/loader.h"
#include "sana/distributed/check_dist.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/train/options/core_options.h"

namespace sana::app {

namespace {

class CheckDist : public ConfigSubcommand {
 public:
  CheckDist(CLI::App& app, const train::TestHooks& hooks)
      : ConfigSubcommand(app, "check-dist", "pre-flight check: rendezvous, devices, agreement, all-reduce bandwidth",
                         {/*required=*/false, /*data=*/false}),
        hooks_(hooks) {
    cli_->add_option("--seconds", opts_.soak_seconds, "keep all-reducing this many seconds after the table (a soak)");
  }
  int run(const dist::LaunchEnv& env, const config::Config& cfg) override {
    dist::CheckDistOptions o = opts_;
    o.runtime = train::runtime_options_for(cfg, hooks_);
    o.config_fingerprint = config::config_fingerprint(cfg);
    o.flight_dir = dist::flight_record_dir(cfg.work_dir);
    return dist::run_check_dist(env, o);
  }

 private:
  const train::TestHooks& hooks_;
  dist::CheckDistOptions opts_;
};

}  // namespace

std::unique_ptr<ConfigCommand> check_dist_command(CLI::App& app, const train::TestHooks& hooks) {
  return std::make_unique<CheckDist>(app, hooks);
}

}  // namespace sana::app
