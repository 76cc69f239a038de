// Where a training step's time goes, measured on the host with a steady clock: the phases
// the trainer runs in order, and the rest (bookkeeping: the step agreement, metrics). On
// CUDA, kernels run asynchronously, so a phase's time is the host's time in it; the device
// catches up where the host next reads a result (the step agreement's read, the step's one
// wait for the device), which lands in "other". There the same phases are also timed on the
// device, by events on the compute stream (step/device_timeline.h): PhaseTimer marks both.
#pragma once

#include <chrono>

namespace sana::train {

struct StepTimes {
  double data = 0;              // waiting for the loader's batches
  double encoders = 0;          // VAE and text encoder, when the run has them
  double forward_backward = 0;  // the model's forward and backward (buckets start their all-reduce during it)
  double allreduce = 0;         // waiting for the gradient all-reduce after the last backward
  double optimizer = 0;         // gradient norm, clipping, EMA, the optimizer's update, zeroing gradients
  double checkpoint_preview = 0;
  double total = 0;  // the whole step
  double other() const {
    return total - (data + encoders + forward_backward + allreduce + optimizer + checkpoint_preview);
  }
  StepTimes& operator+=(const StepTimes& o) {
    data += o.data;
    encoders += o.encoders;
    forward_backward += o.forward_backward;
    allreduce += o.allreduce;
    optimizer += o.optimizer;
    checkpoint_preview += o.checkpoint_preview;
    total += o.total;
    return *this;
  }
};

// One of StepTimes' phases (&StepTimes::data, ...).
using Phase = double StepTimes::*;

// Where PhaseTimer marks the device's side of the phases (train/step/device_timeline.h): set for
// the thread while a CUDA step runs, else none.
class PhaseMarks {
 public:
  virtual ~PhaseMarks() = default;
  virtual void enter(Phase phase) = 0;  // the device's work queued from now is this phase's
  virtual void leave(Phase phase) = 0;  // ... no longer: the phase entered before it again
  static PhaseMarks*& current() {
    thread_local PhaseMarks* marks = nullptr;
    return marks;
  }
};

// No marks while it lives (work of its own inside a phase, such as the held-out loss inside
// checkpoint_preview: the device counts it there, as the host does).
class NoPhaseMarks {
 public:
  NoPhaseMarks() : saved_(PhaseMarks::current()) { PhaseMarks::current() = nullptr; }
  ~NoPhaseMarks() { PhaseMarks::current() = saved_; }
  NoPhaseMarks(const NoPhaseMarks&) = delete;
  NoPhaseMarks& operator=(const NoPhaseMarks&) = delete;

 private:
  PhaseMarks* saved_;
};

// Seconds since the last lap() (or construction).
class Lap {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Adds the wall time of its scope to one phase of a StepTimes, less what lies between
// pause() and resume(); and marks the same span on the device where marks are set.
class PhaseTimer {
 public:
  PhaseTimer(StepTimes& times, Phase phase) : seconds_(times.*phase), phase_(phase), marks_(PhaseMarks::current()) {
    if (marks_ != nullptr) marks_->enter(phase_);
  }
  ~PhaseTimer() { pause(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  void pause() {
    if (!running_) return;
    seconds_ += lap_.lap();
    running_ = false;
    if (marks_ != nullptr) marks_->leave(phase_);
  }
  void resume() {
    if (running_) return;
    lap_.lap();
    running_ = true;
    if (marks_ != nullptr) marks_->enter(phase_);
  }

 private:
  double& seconds_;
  Phase phase_;
  PhaseMarks* marks_;
  Lap lap_;
  bool running_ = true;
};

}  // namespace sana::train
