#include "sana/train/report/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<int64_t>(s + 0.5);
  return total >= 3600 ? fmt::format("{}h{:02d}m", total / 3600, (total / 60) % 60)
                       : fmt::format("{}m{:02d}s", total / 60, total % 60);
}

Metrics::Metrics(MetricsOptions options, bool main_rank, int64_t total_steps, bool resumed, int world,
                 double peak_flops)
    : o_(std::move(options)),
      main_rank_(main_rank),
      tty_(main_rank && isatty(STDERR_FILENO) && !std::getenv("SANA_NO_PROGRESS")),
      total_(total_steps),
      world_(std::max(world, 1)),
      peak_flops_(peak_flops) {
  if (!main_rank_) return;
  const auto path = std::filesystem::path(o_.work_dir) / "metrics.jsonl";
  jsonl_.open(path, resumed ? std::ios::app : std::ios::trunc);
  if (!jsonl_) throw RunError(fmt::format("cannot write {}/metrics.jsonl", o_.work_dir));
  if (o_.tensorboard) {
    events_ = std::make_unique<EventWriter>((std::filesystem::path(o_.work_dir) / "tensorboard").string());
    log::info("TensorBoard: {} (tensorboard --logdir {})", events_->path(),
              (std::filesystem::path(o_.work_dir) / "tensorboard").string());
  }
}

void Metrics::begin_interval(double wait_seconds) {
  iv_ = Interval{};
  iv_.wait0 = last_wait_ = wait_seconds;
}

void Metrics::new_loader(double wait_seconds) {
  if (run_steps_ == 0) {
    begin_interval(wait_seconds);
    return;
  }
  iv_.wait_before += last_wait_ - iv_.wait0;
  iv_.wait0 = last_wait_ = wait_seconds;
}

void Metrics::record_device(int64_t step, const StepTimes& times) {
  iv_.device += times;
  ++iv_.device_steps;
  device_ = {step, times};
  if (!main_rank_ || !events_) return;
  events_->scalars(step, {{"device_time/step", times.total},
                          {"device_time/data", times.data},
                          {"device_time/encoders", times.encoders},
                          {"device_time/forward_backward", times.forward_backward},
                          {"device_time/allreduce", times.allreduce},
                          {"device_time/optimizer", times.optimizer},
                          {"device_time/checkpoint_preview", times.checkpoint_preview},
                          {"device_time/other", times.other()}});
}

void Metrics::record(const StepRecord& s, const StepTimes& phases, double wait_seconds, bool force_log) {
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - run_start_).count();
  StepTimes times = phases;
  times += carried_;
  carried_ = StepTimes{};
  times.total = std::chrono::duration<double>(now - last_record_).count();
  last_record_ = now;
  last_wait_ = wait_seconds;
  iv_.times += times;
  if (s.has_loss && std::isfinite(s.loss)) {
    if (std::isnan(first_loss_)) first_loss_ = s.loss;
    last_loss_ = s.loss;
  }
  if (s.has_loss) {
    iv_.loss += s.loss;
    ++iv_.loss_steps;
  }
  for (const auto& [name, v] : s.figures) {
    auto it = std::find_if(iv_.figures.begin(), iv_.figures.end(), [&](const auto& f) { return f.first == name; });
    if (it == iv_.figures.end()) it = iv_.figures.insert(iv_.figures.end(), {name, {0.0, 0}});
    it->second.first += v;
    ++it->second.second;
  }
  iv_.grad_norm += s.grad_norm;
  iv_.samples += static_cast<double>(s.samples);
  iv_.flops += s.train_flops;
  run_samples_ += s.samples;
  ++run_steps_;
  ++iv_.steps;
  if (main_rank_) write_line(s, times, elapsed);
  const double eta = eta_seconds(s.global_step, elapsed);
  if (tty_) {
    fmt::print(stderr, "\r[{:<30}] {}/{} loss {:.4f} ETA {}   ",
               std::string(static_cast<size_t>(30 * s.global_step / total_), '#'), s.global_step, total_, s.loss,
               duration_text(eta));
  }
  if (s.global_step % o_.log_interval == 0 || s.global_step == total_ || force_log) {
    log_interval(s, wait_seconds, elapsed);
  }
}

// From this run's pace: a resumed run's earlier steps took none of its time.
double Metrics::eta_seconds(int64_t global_step, double elapsed) const {
  return elapsed / static_cast<double>(std::max<int64_t>(run_steps_, 1)) * static_cast<double>(total_ - global_step);
}

void Metrics::record_eval(int64_t global_step, int64_t samples, double loss,
                          const std::map<int64_t, double>& by_timestep) {
  if (!main_rank_) return;
  nlohmann::json per = nlohmann::json::object();
  std::vector<std::pair<std::string, double>> scalars{{"eval/loss", loss}};
  for (const auto& [t, v] : by_timestep) {
    per[std::to_string(t)] = v;
    scalars.emplace_back(fmt::format("eval/loss_t{}", t), v);
  }
  const nlohmann::json m = {{"eval_step", global_step}, {"eval_loss", loss}, {"eval_samples", samples},
                            {"eval_loss_by_timestep", per}};
  append(m);
  if (!events_) return;
  events_->scalars(global_step, scalars);
  events_->flush();
}

void Metrics::append(const nlohmann::json& m) {
  // A line a full disk cut short stays on a line of its own (readers skip it, report.cpp);
  // the stream is tried again at each line, so writing resumes once there is room.
  if (jsonl_broken_) {
    jsonl_.clear();
    jsonl_ << "\n";
  }
  jsonl_ << m.dump() << "\n" << std::flush;
  const bool failed = !jsonl_;
  if (failed && !jsonl_broken_) {
    log::warn("{}/metrics.jsonl: cannot write ({}): its lines are lost until writing works again", o_.work_dir,
              std::strerror(errno));
  } else if (!failed && jsonl_broken_) {
    log::info("{}/metrics.jsonl: writing again", o_.work_dir);
  }
  jsonl_broken_ = failed;
}

void Metrics::regrouped(int64_t step, int world, const std::vector<int>& lost, double seconds,
                        const std::vector<int>& joined) {
  world_ = std::max(world, 1);
  regroup_ = {{"after_step", step}, {"world", world}, {"lost", lost}, {"joined", joined}, {"seconds", seconds}};
}

void Metrics::write_line(const StepRecord& s, const StepTimes& t, double elapsed) {
  const auto number_or_null = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const double step_time = std::max(t.total, 1e-9);
  const double samples_per_s = static_cast<double>(s.samples) / step_time;
  nlohmann::json m = {{"epoch", s.epoch + 1},
                      {"step", s.global_step},
                      {"epoch_step", s.epoch_step + 1},
                      {"loss", s.has_loss ? number_or_null(s.loss) : nlohmann::json(nullptr)},
                      {"grad_norm", number_or_null(s.grad_norm)},
                      {"lr", s.lr},
                      {"samples", s.samples},
                      {"height", s.height},
                      {"width", s.width},
                      {"time_s", elapsed},
                      // per step, as TensorBoard's train/samples_per_s; the run's average since
                      // start-up (start-up included) has its own name
                      {"samples_per_s", samples_per_s},
                      {"run_samples_per_s", static_cast<double>(run_samples_) / std::max(elapsed, 1e-9)},
                      {"skipped", s.skipped},
                      {"time", {{"total", t.total},
                                {"data", t.data},
                                {"encoders", t.encoders},
                                {"forward_backward", t.forward_backward},
                                {"allreduce", t.allreduce},
                                {"optimizer", t.optimizer},
                                {"checkpoint_preview", t.checkpoint_preview},
                                {"other", t.other()}}}};
  for (const auto& [name, v] : s.figures) m[name] = number_or_null(v);
  if (device_) {
    const auto& [step, d] = *device_;
    m["device_time"] = {{"step", step},
                        {"total", d.total},
                        {"data", d.data},
                        {"encoders", d.encoders},
                        {"forward_backward", d.forward_backward},
                        {"allreduce", d.allreduce},
                        {"optimizer", d.optimizer},
                        {"checkpoint_preview", d.checkpoint_preview},
                        {"other", d.other()}};
    device_.reset();
  }
  if (!regroup_.is_null()) m["regroup"] = std::exchange(regroup_, nlohmann::json());
  const double flops_per_s = s.train_flops / world_ / step_time;  // one process's share
  if (s.train_flops > 0) m["tflops_per_process"] = flops_per_s / 1e12;
  if (s.train_flops > 0 && peak_flops_ > 0) m["mfu"] = flops_per_s / peak_flops_;
  append(m);
  if (!events_) return;
  std::vector<std::pair<std::string, double>> scalars{{"train/grad_norm", s.grad_norm},
                                   {"train/lr", s.lr},
                                   {"train/samples_per_s", samples_per_s},
                                   {"train/data_wait", t.data / step_time},
                                   {"train/bad_samples", static_cast<double>(s.bad_samples)},
                                   {"train/skipped", s.skipped ? 1.0 : 0.0},
                                   {"time/step", t.total},
                                   {"time/data", t.data},
                                   {"time/encoders", t.encoders},
                                   {"time/forward_backward", t.forward_backward},
                                   {"time/allreduce", t.allreduce},
                                   {"time/optimizer", t.optimizer},
                                   {"time/checkpoint_preview", t.checkpoint_preview},
                                   {"time/other", t.other()}};
  if (s.has_loss) scalars.emplace_back("train/loss", s.loss);
  for (const auto& [name, v] : s.figures) scalars.emplace_back("train/" + name, v);
  if (s.train_flops > 0) scalars.emplace_back("perf/tflops_per_process", flops_per_s / 1e12);
  if (s.train_flops > 0 && peak_flops_ > 0) scalars.emplace_back("perf/mfu", flops_per_s / peak_flops_);
  events_->scalars(s.global_step, scalars);
  events_->flush();
}

// " | fwd+bwd 95% all-reduce 1% ...": each phase's share of the interval (data wait is
// already on the line), phases that took no time left out.
std::string phase_text(const StepTimes& t, bool data) {
  if (t.total <= 0) return "";
  std::string out = " |";
  const auto add = [&](const char* name, double v) {
    if (v > 0.0005 * t.total) out += fmt::format(" {} {:.1f}%", name, 100.0 * v / t.total);
  };
  if (data) add("data", t.data);
  add("encoders", t.encoders);
  add("fwd+bwd", t.forward_backward);
  add("all-reduce", t.allreduce);
  add("optimizer", t.optimizer);
  add("checkpoint/preview", t.checkpoint_preview);
  add("other", t.other());
  return out;
}

void Metrics::log_interval(const StepRecord& s, double wait_seconds, double elapsed) {
  const double secs = std::chrono::duration<double>(Clock::now() - iv_.start).count();
  const double wait = iv_.wait_before + wait_seconds - iv_.wait0;
  const double eta = eta_seconds(s.global_step, elapsed);
  const double steps = static_cast<double>(iv_.steps);
  if (tty_) fmt::print(stderr, "\n");
  const double flops_per_s = iv_.flops / world_ / std::max(secs, 1e-9);
  // The model's FLOP/s per process: GFLOP/s on a CPU, TFLOP/s on a GPU; MFU where the peak is known.
  std::string perf;
  if (iv_.flops > 0) {
    perf = flops_per_s >= 1e12 ? fmt::format(" {:.3g} TFLOP/s", flops_per_s / 1e12)
                               : fmt::format(" {:.3g} GFLOP/s", flops_per_s / 1e9);
    if (peak_flops_ > 0) perf += fmt::format(" MFU {:.1f}%", 100.0 * flops_per_s / peak_flops_);
  }
  std::string losses = iv_.loss_steps > 0 ? fmt::format(" loss {:.4f}", iv_.loss / static_cast<double>(iv_.loss_steps))
                                          : std::string();
  for (const auto& [name, f] : iv_.figures) {
    losses += fmt::format(" {} {:.4f}", name, f.first / static_cast<double>(f.second));
  }
  log::info("epoch {} step {}/{}{} grad {:.3f} lr {:.2e} {:.1f} samples/s{} data wait {:.0f}% {}x{} ETA {}{}{}",
            s.epoch + 1, s.global_step, total_, losses, iv_.grad_norm / steps, s.lr,
            iv_.samples / std::max(secs, 1e-9), perf, 100.0 * wait / std::max(secs, 1e-9), s.height, s.width,
            duration_text(eta), phase_text(iv_.times),
            iv_.device_steps > 0 ? " | device:" + phase_text(iv_.device, true).substr(2) : std::string());
  begin_interval(wait_seconds);
}

void Metrics::finish(int64_t global_step, int64_t skipped, bool stopped) {
  const double seconds = std::chrono::duration<double>(Clock::now() - run_start_).count();
  log::info("done: {} steps, {} skipped (non-finite or fp16 overflow); {} in this run in {:.1f} s; loss {:.4f} (this run's first step) -> {:.4f} "
            "(last step){}",
            global_step, skipped, run_steps_, seconds, first_loss_, last_loss_, stopped ? "; stopped on request" : "");
  if (jsonl_.is_open()) jsonl_.close();
}

}  // namespace sana::train
