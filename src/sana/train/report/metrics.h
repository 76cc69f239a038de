// What a run reports while it trains: one metrics.jsonl line per step (rank 0), the same
// figures as TensorBoard scalars (train.report_to: tensorboard), a progress bar on a
// terminal, and a log line every train.log_interval steps with the interval's loss,
// gradient norm, throughput, data wait, model TFLOP/s per process (and MFU against the
// device's peak, where known) and step phases. Owns the interval sums and
// the first/last loss of the run, and where the time went (StepTimes: per step in
// metrics.jsonl, per interval in the log line); it never talks to other ranks.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sana/train/step/step_times.h"
#include "sana/train/report/tensorboard.h"

namespace sana::train {

// One optimizer step as the ranks agreed on it.
struct StepRecord {
  int64_t epoch = 0;       // from 0
  int64_t epoch_step = 0;  // the step's index in its epoch's plan, from 0
  int64_t global_step = 0; // steps done, this one included
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t height = 0, width = 0;  // the step's resolution in pixels
  bool skipped = false;           // non-finite: no update
  int64_t samples = 0;            // the step's global batch
  int64_t bad_samples = 0;        // the run's bad samples so far, all ranks
  double train_flops = 0;         // the model's training FLOPs for the step, all ranks (3 x forward; 0: not counted)
  // false: the step trains nothing whose loss "loss" is (SANA-Sprint's discriminator steps):
  // "loss" is null in metrics.jsonl, and the averages and first/last losses leave it out.
  bool has_loss = true;
  // More of the step's figures by name (SANA-Sprint's losses of each phase): beside "loss"
  // in metrics.jsonl, train/<name> in TensorBoard, their interval means on the log line.
  std::vector<std::pair<std::string, double>> figures;
};

// "1m05s", "2h03m"; "?" for unknown.
std::string duration_text(double seconds);
// " | fwd+bwd 95.0% all-reduce 1.0% ...": each phase's share of t.total (`data` too when
// asked: the device's data phase is its idle time while the host waits for batches).
std::string phase_text(const StepTimes& t, bool data = false);

// Where the run's figures go and how often the log gets a line (train/options/torch_options.h
// fills it from the config).
struct MetricsOptions {
  std::string work_dir;       // metrics.jsonl and tensorboard/ go there
  int64_t log_interval = 1;   // train.log_interval: a log line every N steps
  bool tensorboard = false;   // train.report_to: tensorboard
};

class Metrics {
 public:
  // resumed: metrics.jsonl continues (a resumed run appends; report reads the last line
  // of each step, so lines past the checkpoint from the interrupted run do no harm).
  // world: processes; peak_flops: one device's peak FLOP/s (0: unknown, no MFU).
  Metrics(MetricsOptions options, bool main_rank, int64_t total_steps, bool resumed, int world = 1,
          double peak_flops = 0);

  // At the start of each epoch's loader, with its data-wait clock so far. The log interval
  // goes on across it (its means cover every step since the last line, whatever the
  // epochs' length); the run's first loader starts the first interval, so that start-up
  // time is not in its samples/s.
  void new_loader(double wait_seconds);
  // After each step, with its phases (times.total is ignored: a step's time is the wall
  // time since the previous record). force_log: write the interval line now (a stop request).
  void record(const StepRecord& s, const StepTimes& times, double wait_seconds, bool force_log);
  // A step's phases as the device timed them (train/step/device_timeline.h), before the record()
  // of a later step: that step's metrics.jsonl line carries the latest as "device_time"
  // {"step", "total", "data", ...}, TensorBoard has them as device_time/<phase> at their own
  // step, and the interval's log line their shares (" | device: fwd+bwd 80.1% ...").
  void record_device(int64_t step, const StepTimes& times);
  // A held-out evaluation (train.eval, rank 0 writes): a metrics.jsonl line {"eval_step",
  // "eval_loss", "eval_samples", "eval_loss_by_timestep": {"100": ...}} and the TensorBoard
  // scalars eval/loss and eval/loss_t<T>.
  void record_eval(int64_t global_step, int64_t samples, double loss, const std::map<int64_t, double>& by_timestep);
  // Time spent after record() in a phase (checkpoint writes): the next record counts it in
  // that phase, as the next step's wall time holds it.
  void add_time(const StepTimes& times) { carried_ += times; }
  // The closing line: steps, time, skipped steps (non-finite or fp16 overflow, the whole
  // run's) and this run's first and last loss.
  void finish(int64_t global_step, int64_t skipped, bool stopped);
  // dist.elastic continue: after step `step`, `world` ranks went on without `lost` (original
  // ranks) and with `joined` (replacements), after a regroup of `seconds`. The next step's
  // metrics.jsonl line carries it as "regroup": {"after_step", "world", "lost", "joined",
  // "seconds"}, and the per-process figures use
  // the new world.
  void regrouped(int64_t step, int world, const std::vector<int>& lost, double seconds,
                 const std::vector<int>& joined = {});
  // Rank 0's TensorBoard writer (nullptr elsewhere or with train.report_to none).
  EventWriter* events() { return events_.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  void log_interval(const StepRecord& s, double wait_seconds, double elapsed);
  void write_line(const StepRecord& s, const StepTimes& times, double elapsed);
  // One line of metrics.jsonl; a failed write (a full disk) is said once and tried again.
  void append(const nlohmann::json& m);
  double eta_seconds(int64_t global_step, double elapsed) const;

  MetricsOptions o_;
  bool main_rank_, tty_;
  int64_t total_;
  int world_;
  nlohmann::json regroup_;  // regrouped()'s, for the next line (null: none)
  bool jsonl_broken_ = false;  // the last line could not be written
  double peak_flops_;
  std::ofstream jsonl_;
  std::unique_ptr<EventWriter> events_;
  Clock::time_point run_start_ = Clock::now();
  Clock::time_point last_record_ = Clock::now();
  double first_loss_ = NAN, last_loss_ = NAN;
  int64_t run_samples_ = 0;  // samples of the steps this process ran
  int64_t run_steps_ = 0;    // steps recorded in this run (a resumed run starts at 0)
  StepTimes carried_;        // add_time's, for the next record
  std::optional<std::pair<int64_t, StepTimes>> device_;  // record_device's latest, for the next line
  double last_wait_ = 0;     // the current loader's data-wait clock at the last record
  void begin_interval(double wait_seconds);
  struct Interval {
    // wait0: the current loader's clock when the interval (or that loader) began;
    // wait_before: the data wait of the interval's earlier loaders.
    double loss = 0, grad_norm = 0, samples = 0, wait0 = 0, wait_before = 0, flops = 0;
    StepTimes times;
    StepTimes device;          // record_device's, summed
    int64_t device_steps = 0;  // how many
    int64_t steps = 0, loss_steps = 0;
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> figures;  // name -> (sum, count), first seen first
    Clock::time_point start = Clock::now();
  } iv_;
};

}  // namespace sana::train
