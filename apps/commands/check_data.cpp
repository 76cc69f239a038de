// `sana-train check-data --config C [--limit N]`: decodes every sample through the real
// loader (data/check_data.h) and prints good and bad counts by reason and images/s; more
// bad samples than data.max_bad_fraction is a failure (exit 1).
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "sana/data/check_data.h"
#include "sana/util/error.h"

namespace sana::app {

namespace {

class CheckData : public ConfigSubcommand {
 public:
  explicit CheckData(CLI::App& app)
      : ConfigSubcommand(app, "check-data", "decode every sample through the real loader; count bad ones by reason") {
    cli_->add_option("--limit", limit_, "decode only this many samples");
  }
  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    const auto r = data::check_data(cfg, limit_);
    std::cout << fmt::format("check-data: {} samples in {:.1f} s ({:.1f} images/s, {} workers)\n", r.samples,
                             r.seconds, r.samples / r.seconds, r.workers);
    std::cout << fmt::format("  good: {}\n", r.samples - r.substituted);
    for (const auto& [reason, n] : r.bad_by_reason) std::cout << fmt::format("  bad, {}: {}\n", reason, n);
    std::cout << fmt::format("  bad fraction {:.4f} (data.max_bad_fraction {})\n", r.bad_fraction(),
                             cfg.data.max_bad_fraction);
    if (r.bad_fraction() > cfg.data.max_bad_fraction) {
      std::cout << std::flush;
      throw RunError("too many bad samples; fix or remove them (the log names each file once)", "check-data");
    }
    std::cout << "check-data: ok\n";
    return 0;
  }

 private:
  int64_t limit_ = 0;
};

}  // namespace

std::unique_ptr<ConfigCommand> check_data_command(CLI::App& app) { return std::make_unique<CheckData>(app); }

}  // namespace sana::app
