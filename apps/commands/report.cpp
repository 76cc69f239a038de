// `sana-train report WORK_DIR`: plots and a summary of a run's metrics (train/report/report.h
// makes them). No metrics at all is a usage error (exit 2); plots that could not be drawn
// after the summary was printed are a failure (exit 1).
#include <iostream>

#include "command.h"
#include "sana/train/report/report.h"
#include "sana/util/error.h"

namespace sana::app {

namespace {

class Report : public PlainSubcommand {
 public:
  explicit Report(CLI::App& app)
      : PlainSubcommand(app, "report", "plots (PNG) and a summary of a run from its metrics.jsonl") {
    cli_->add_option("work_dir", work_dir_, "the run's work_dir")->required();
  }

  int run() override {
    const auto r = train::write_report(work_dir_);
    if (!r.summary.empty()) std::cout << r.summary;
    for (const auto& p : r.plots) std::cout << "plot: " << p << "\n";
    if (r.error.empty()) return 0;
    if (r.summary.empty()) throw UsageError(r.error, "report");
    throw RunError(r.error, "report");
  }

 private:
  std::string work_dir_;
};

}  // namespace

std::unique_ptr<PlainCommand> report_command(CLI::App& app) { return std::make_unique<Report>(app); }

}  // namespace sana::app
