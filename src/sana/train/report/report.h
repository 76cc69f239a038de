// What `sana-train report WORK_DIR` shows (also made at the end of training): plots of loss, learning
// rate and samples/s over steps from work_dir/metrics.jsonl (and the held-out loss of
// train.eval, overall and per timestep, when the run measured one), drawn by gnuplot (Debian's
// gnuplot-nox) as PNG files in work_dir/report/, and a one-screen text summary. No torch.
#pragma once

#include <string>
#include <vector>

namespace sana::train {

struct Report {
  std::string summary;             // the text summary (also work_dir/report/summary.txt)
  std::vector<std::string> plots;  // PNG paths
  std::string error;               // why plots or the summary are missing, "" when fine
};

Report write_report(const std::string& work_dir);

}  // namespace sana::train
