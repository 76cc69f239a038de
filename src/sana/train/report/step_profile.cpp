#include "sana/train/report/step_profile.h"

#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "sana/util/log.h"

namespace sana::train {

namespace fs = std::filesystem;

namespace {

// Each host event's innermost enclosing host event on its thread (-1: none) and its own
// time: its duration less that of the events directly inside it.
struct Nesting {
  std::vector<int64_t> parent;
  std::vector<uint64_t> self_ns;
};

Nesting nest(const std::vector<ProfiledEvent>& events) {
  Nesting n{std::vector<int64_t>(events.size(), -1), std::vector<uint64_t>(events.size(), 0)};
  std::map<uint64_t, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!events[i].on_device) by_thread[events[i].thread].push_back(i);
  }
  for (auto& [thread, ids] : by_thread) {
    // Outer events first where two start together.
    std::sort(ids.begin(), ids.end(), [&](size_t a, size_t b) {
      if (events[a].start_ns != events[b].start_ns) return events[a].start_ns < events[b].start_ns;
      return events[a].end_ns > events[b].end_ns;
    });
    std::vector<size_t> open;
    for (size_t i : ids) {
      const auto& e = events[i];
      while (!open.empty() && events[open.back()].end_ns <= e.start_ns) open.pop_back();
      n.self_ns[i] = e.end_ns - e.start_ns;
      if (!open.empty()) {
        n.parent[i] = static_cast<int64_t>(open.back());
        auto& outer = n.self_ns[open.back()];
        outer -= std::min(outer, e.end_ns - e.start_ns);
      }
      open.push_back(i);
    }
  }
  return n;
}

}  // namespace

std::vector<OpRow> op_table(const std::vector<ProfiledEvent>& events) {
  const auto n = nest(events);
  std::unordered_map<uint64_t, size_t> by_correlation;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!events[i].on_device && events[i].correlation != 0) by_correlation.emplace(events[i].correlation, i);
  }
  std::map<std::string, OpRow> rows;
  double cpu_total = 0, device_total = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    const double ms = static_cast<double>(e.end_ns - e.start_ns) / 1e6;
    if (!e.on_device) {
      auto& r = rows[e.name];
      r.op = e.name;
      ++r.calls;
      r.cpu_ms += static_cast<double>(n.self_ns[i]) / 1e6;
      cpu_total += static_cast<double>(n.self_ns[i]) / 1e6;
      continue;
    }
    device_total += ms;
    const auto host = by_correlation.find(e.launched_by);
    std::string owner = "(device) " + e.name;  // no launching op recorded
    if (host != by_correlation.end()) {
      int64_t at = static_cast<int64_t>(host->second);
      // A kernel linked to the runtime call that launched it counts for the op around the call.
      while (events[static_cast<size_t>(at)].runtime && n.parent[static_cast<size_t>(at)] >= 0) {
        at = n.parent[static_cast<size_t>(at)];
      }
      owner = events[static_cast<size_t>(at)].name;
    }
    auto& r = rows[owner];
    r.op = owner;
    r.device_ms += ms;
  }
  std::vector<OpRow> out;
  for (auto& [name, r] : rows) {
    r.share = device_total > 0 ? r.device_ms / device_total : (cpu_total > 0 ? r.cpu_ms / cpu_total : 0);
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const OpRow& a, const OpRow& b) {
    if (a.share != b.share) return a.share > b.share;
    return a.cpu_ms > b.cpu_ms;
  });
  return out;
}

std::string op_table_tsv(const std::vector<OpRow>& rows) {
  std::string out = "op\tcalls\tcpu_ms\tdevice_ms\tshare\n";
  for (const auto& r : rows) {
    out += fmt::format("{}\t{}\t{:.3f}\t{:.3f}\t{:.4f}\n", r.op, r.calls, r.cpu_ms, r.device_ms, r.share);
  }
  return out;
}

namespace prof = torch::profiler::impl;
namespace kin = torch::autograd::profiler;

StepProfiler::StepProfiler(std::vector<int64_t> steps, std::string work_dir, bool on, bool cuda)
    : steps_(std::move(steps)), work_dir_(std::move(work_dir)), on_(on && !steps_.empty()), cuda_(cuda) {}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  try {
    kin::disableProfiler();  // a step that threw: nothing written
  } catch (...) {
  }
}

void StepProfiler::begin(int64_t global_step) {
  if (recording_) {  // a step that did not finish (a regroup after a lost rank): not written
    kin::disableProfiler();
    recording_ = false;
  }
  if (!on_ || std::find(steps_.begin(), steps_.end(), global_step) == steps_.end()) return;
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (cuda_) activities.insert(prof::ActivityType::CUDA);
  // Without a GPU, Kineto's start-up probe of CUDA devices fails as expected and says so as an
  // ERROR line; on a CPU run its log is quiet unless KINETO_LOG_LEVEL says otherwise.
  if (!cuda_) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  kin::prepareProfiler(config, activities);
  kin::enableProfiler(config, activities);
  recording_ = true;
  step_ = global_step;
}

void StepProfiler::end() {
  const int64_t global_step = step_;
  if (!recording_) return;
  if (cuda_) torch::cuda::synchronize();  // the step's kernels are in the record
  recording_ = false;
  auto result = kin::disableProfiler();
  std::vector<ProfiledEvent> events;
  for (const auto& e : result->events()) {
    if (e.isHiddenEvent()) continue;
    const auto kind = static_cast<libkineto::ActivityType>(e.activityType());
    ProfiledEvent p;
    p.name = e.name();
    p.thread = e.startThreadId();
    p.start_ns = e.startNs();
    p.end_ns = std::max(e.endNs(), e.startNs());
    p.on_device = e.deviceType() != c10::DeviceType::CPU || kind == libkineto::ActivityType::CONCURRENT_KERNEL ||
                  kind == libkineto::ActivityType::GPU_MEMCPY || kind == libkineto::ActivityType::GPU_MEMSET;
    p.runtime = kind == libkineto::ActivityType::CUDA_RUNTIME || kind == libkineto::ActivityType::CUDA_DRIVER;
    p.correlation = e.correlationId();
    p.launched_by = e.linkedCorrelationId();
    events.push_back(std::move(p));
  }
  const fs::path dir = fs::path(work_dir_) / "profile";
  fs::create_directories(dir);
  const auto base = dir / fmt::format("step_{}", global_step);
  result->save(base.string() + ".trace.json");
  const auto rows = op_table(events);
  const auto tsv = base.string() + ".ops.tsv";
  std::ofstream(tsv) << op_table_tsv(rows);
  std::string top;
  for (size_t i = 0; i < std::min<size_t>(rows.size(), 5); ++i) {
    top += fmt::format("{}{} {:.1f}%", i == 0 ? "" : ", ", rows[i].op, 100.0 * rows[i].share);
  }
  log::info("train.profile_steps: step {} recorded ({} events) in {}.trace.json; by {} time: {} ({})", global_step,
            events.size(), base.string(), cuda_ ? "device" : "host", top, tsv);
}

}  // namespace sana::train
