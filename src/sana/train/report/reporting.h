// What the run reports about its steps, as Trainer::start sets it up: the metrics (log
// lines, metrics.jsonl, TensorBoard), the profiler of train.profile_steps, the phases
// timed on the device, and whether memory.json was written yet.
//
// Owns: those parts; rank 0 writes what they write.
// Never: changes what a step does.
#pragma once

#include <memory>
#include <optional>

#include "sana/train/report/metrics.h"
#include "sana/train/report/step_profile.h"
#include "sana/train/step/device_timeline.h"

namespace sana::train {

struct Reporting {
  std::optional<Metrics> metrics;
  std::optional<StepProfiler> profiler;  // train.profile_steps
  std::unique_ptr<DeviceTimeline> timeline;  // on CUDA: the phases timed on the device
  bool memory_reported = false;  // after this process's first step: memory.json
};

}  // namespace sana::train
