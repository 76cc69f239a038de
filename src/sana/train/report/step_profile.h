// train.profile_steps: the named optimizer steps recorded with LibTorch's profiler (Kineto;
// host activity, and the CUDA kernels and copies on a GPU) on rank 0, each written to the
// work dir as profile/step_<N>.trace.json (a Chrome trace: chrome://tracing, Perfetto,
// TensorBoard's profiler) and profile/step_<N>.ops.tsv, the per-op table:
//   op  calls  cpu_ms  device_ms  share
// cpu_ms is the op's own host time (its nested ops' time left out), device_ms the time of
// the kernels it launched itself (a kernel counts for the innermost op around its launch),
// share each op's part of the step's device time, of its host time on a run without a
// device. Sorted by share, largest first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sana::train {

// One event of a profiled step, as the table needs it.
struct ProfiledEvent {
  std::string name;
  uint64_t thread = 0;
  uint64_t start_ns = 0, end_ns = 0;
  bool on_device = false;    // a kernel or a device copy; else a host op
  bool runtime = false;      // a host call into the CUDA runtime or driver (a launch, a copy)
  uint64_t correlation = 0;  // a host op's id
  uint64_t launched_by = 0;  // a device event's: the correlation of the op that launched it (0: unknown)
};

struct OpRow {
  std::string op;
  int64_t calls = 0;
  double cpu_ms = 0, device_ms = 0, share = 0;
};

// The per-op table of `events` (any order), sorted by share.
std::vector<OpRow> op_table(const std::vector<ProfiledEvent>& events);
// The table as profile/step_<N>.ops.tsv holds it (a header line, then a row per op).
std::string op_table_tsv(const std::vector<OpRow>& rows);

class StepProfiler {
 public:
  // `steps`: train.profile_steps (global step numbers, counting from 1); `on`: this rank
  // records (rank 0).
  StepProfiler(std::vector<int64_t> steps, std::string work_dir, bool on, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  // Before step `global_step` (the number it will have once taken) starts: records it
  // when it is one of train.profile_steps.
  void begin(int64_t global_step);
  // After the step's update: waits for the device, stops, writes the trace and the table
  // (named by the step begin() was given, taken or skipped), and logs its top ops.
  void end();

 private:
  std::vector<int64_t> steps_;
  std::string work_dir_;
  bool on_, cuda_;
  bool recording_ = false;
  int64_t step_ = 0;  // the step being recorded
};

}  // namespace sana::train
