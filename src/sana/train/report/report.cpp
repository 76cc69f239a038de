#include "sana/train/report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;

namespace sana::train {

namespace {

struct Row {
  int64_t step = 0, epoch = 0;
  double loss = NAN, lr = NAN, sps = NAN, time = NAN, grad = NAN;
  bool skipped = false;
};

// A held-out evaluation (train.eval): its step, overall mean and mean per timestep.
struct EvalRow {
  int64_t step = 0;
  double loss = NAN;
  std::map<int64_t, double> by_timestep;
};

double num(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

// A whole-number field (a float such as 1e300 would be undefined behaviour to cast), or
// `fallback` when absent; anything else throws, which counts the line as bad.
int64_t whole(const nlohmann::json& j, const char* key, std::optional<int64_t> fallback) {
  const auto it = j.find(key);
  if (it == j.end() && fallback) return *fallback;
  if (it == j.end() || !it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    throw std::invalid_argument(key);
  }
  return it->get<int64_t>();
}

double mean_of(const std::vector<Row>& rows, size_t from, size_t to) {
  double s = 0;
  int64_t n = 0;
  for (size_t i = from; i < to; ++i) {
    if (std::isfinite(rows[i].loss)) {
      s += rows[i].loss;
      ++n;
    }
  }
  return n ? s / static_cast<double>(n) : NAN;
}

// The metric rows of work_dir/metrics.jsonl, one per step (a resumed run appends to the
// file: the last record of a step wins), counting lines a crash cut short in `bad_lines`;
// the held-out evaluations' lines (eval_step) into `evals`, one per step.
std::vector<Row> read_rows(std::istream& in, int64_t& bad_lines, std::vector<EvalRow>& evals) {
  std::map<int64_t, Row> by_step;
  std::map<int64_t, EvalRow> eval_by_step;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("eval_step")) {
        EvalRow e;
        e.step = whole(j, "eval_step", std::nullopt);
        e.loss = num(j, "eval_loss");
        const auto per = j.value("eval_loss_by_timestep", nlohmann::json::object());
        for (const auto& [t, v] : per.items()) e.by_timestep[std::stoll(t)] = v.get<double>();
        eval_by_step[e.step] = e;
        continue;
      }
      Row row;
      row.step = whole(j, "step", std::nullopt);
      row.epoch = whole(j, "epoch", 0);
      row.loss = num(j, "loss");
      row.lr = num(j, "lr");
      // sana-train up to 0016840 wrote the run average as samples_per_s
      row.sps = num(j, j.contains("run_samples_per_s") ? "run_samples_per_s" : "samples_per_s");
      row.time = num(j, "time_s");
      row.grad = num(j, "grad_norm");
      row.skipped = j.value("skipped", false);
      by_step[row.step] = row;
    } catch (const std::exception&) {
      ++bad_lines;  // a line cut by a crash: the rest still plots
    }
  }
  std::vector<Row> rows;
  for (const auto& [step, row] : by_step) rows.push_back(row);
  for (const auto& [step, e] : eval_by_step) evals.push_back(e);
  return rows;
}

// The held-out loss's line of the summary: "" without evaluations.
std::string eval_summary(const std::vector<EvalRow>& evals) {
  if (evals.empty()) return "";
  const auto best = std::min_element(evals.begin(), evals.end(), [](const EvalRow& a, const EvalRow& b) {
    return a.loss < b.loss;
  });
  return fmt::format("held-out loss (train.eval): {:.4f} at step {} -> {:.4f} at step {}, lowest {:.4f} at step {}\n",
                     evals.front().loss, evals.front().step, evals.back().loss, evals.back().step, best->loss,
                     best->step);
}

// eval_loss.png: the held-out loss over steps, overall and at each timestep (a gnuplot
// script's lines, its data file written into `dir`).
std::string eval_plot(const fs::path& dir, const std::vector<EvalRow>& evals,
                      const std::function<std::string(const std::string&)>& quoted) {
  std::ofstream data(dir / "eval.dat");
  for (const auto& e : evals) {
    data << e.step << ' ' << e.loss;
    for (const auto& [t, v] : evals.front().by_timestep) {
      const auto it = e.by_timestep.find(t);
      data << ' ' << (it != e.by_timestep.end() ? fmt::format("{}", it->second) : "NaN");
    }
    data << '\n';
  }
  const auto file = quoted((dir / "eval.dat").string());
  std::string plot = fmt::format("plot {} using 1:2 with linespoints lw 2 title 'all timesteps'", file);
  int col = 3;
  for (const auto& [t, v] : evals.front().by_timestep) {
    plot += fmt::format(", {} using 1:{} with linespoints title 't = {}'", file, col++, t);
  }
  return fmt::format("set output {}\nset title 'held-out loss (train.eval: same samples, timesteps and noise)'\n"
                     "set key outside\n{}\nunset key\n",
                     quoted((dir / "eval_loss.png").string()), plot);
}

std::string summary_text(const std::string& work_dir, const std::vector<Row>& rows, int64_t bad_lines) {
  const size_t n = rows.size(), tenth = std::max<size_t>(1, n / 10);
  double min_loss = INFINITY;
  int64_t min_step = 0, skipped = 0;
  for (const auto& row : rows) {
    if (std::isfinite(row.loss) && row.loss < min_loss) {
      min_loss = row.loss;
      min_step = row.step;
    }
    skipped += row.skipped ? 1 : 0;
  }
  const auto& last = rows.back();
  return fmt::format(
      "run: {}\n"
      "steps: {} (epochs {}), {} skipped (non-finite, or fp16 overflow){}\n"
      "loss: {:.4f} (mean of the first {} steps) -> {:.4f} (mean of the last {}), lowest {:.4f} at step {}\n"
      "learning rate: {:.3g} at the end\n"
      "throughput: {:.1f} samples/s over the last run's {:.1f} s (a resumed run starts its clock anew)\n",
      work_dir, last.step, last.epoch, skipped,
      bad_lines ? fmt::format(", {} unreadable metric lines", bad_lines) : "", mean_of(rows, 0, tenth), tenth,
      mean_of(rows, n - tenth, n), tenth, min_loss, min_step, last.lr, last.sps, last.time);
}

// Plots into `dir`: a data file and a gnuplot script, run with a time limit. Sets the
// report's plots, or its error when gnuplot fails.
void draw_plots(const fs::path& dir, const std::vector<Row>& rows, const std::vector<EvalRow>& evals, Report& r) {
  {
    std::ofstream data(dir / "metrics.dat");
    for (const auto& row : rows) {
      data << row.step << ' ' << (std::isfinite(row.loss) ? fmt::format("{}", row.loss) : "NaN") << ' ' << row.lr
           << ' ' << (std::isfinite(row.sps) ? fmt::format("{}", row.sps) : "NaN") << '\n';
    }
  }
  const std::vector<std::tuple<std::string, int, std::string>> plots = {
      {"loss.png", 2, "loss (flow matching, mean over ranks)"},
      {"lr.png", 3, "learning rate"},
      {"samples_per_s.png", 4, "samples/s (average since each run started; restarts on resume)"}};
  std::ofstream script(dir / "plot.gp");
  script << "set terminal pngcairo size 900,500 noenhanced\nset grid\nset xlabel 'optimizer step'\n";
  // A gnuplot single-quoted string: a quote inside is written twice (a work_dir may hold one).
  const std::function<std::string(const std::string&)> quoted = [](const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  };
  for (const auto& [file, col, title] : plots) {
    script << fmt::format("set output {}\nset title {}\nplot {} using 1:{} with lines lw 2 notitle\n",
                          quoted((dir / file).string()), quoted(title), quoted((dir / "metrics.dat").string()), col);
  }
  if (!evals.empty()) script << eval_plot(dir, evals, quoted);
  script.close();
  const std::string cmd = fmt::format("timeout 120 gnuplot '{}' 2>'{}'", (dir / "plot.gp").string(),
                                      (dir / "gnuplot.log").string());
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    r.error = fmt::format("gnuplot failed (exit {}; see {}); where it is missing, apt-get install gnuplot-nox",
                          WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, (dir / "gnuplot.log").string());
    return;
  }
  for (const auto& [file, col, title] : plots) r.plots.push_back((dir / file).string());
  if (!evals.empty()) r.plots.push_back((dir / "eval_loss.png").string());
}

}  // namespace

Report write_report(const std::string& work_dir) {
  Report r;
  const fs::path metrics = fs::path(work_dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) {
    r.error = fmt::format("no {} (written by training)", metrics.string());
    return r;
  }
  int64_t bad_lines = 0;
  std::vector<EvalRow> evals;
  const auto rows = read_rows(in, bad_lines, evals);
  if (rows.empty()) {
    r.error = fmt::format("{} holds no steps", metrics.string());
    return r;
  }
  const fs::path dir = fs::path(work_dir) / "report";
  fs::create_directories(dir);
  r.summary = summary_text(work_dir, rows, bad_lines) + eval_summary(evals);
  std::ofstream(dir / "summary.txt") << r.summary;
  draw_plots(dir, rows, evals, r);
  return r;
}

}  // namespace sana::train
