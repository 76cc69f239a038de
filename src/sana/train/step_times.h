// Where a training step's time goes, measured on the host with a steady clock: the phases
// the trainer runs in order, and the rest (bookkeeping: the step agreement, metrics). On
// CUDA, kernels run asynchronously, so a phase's time is the host's time in it; the device
// catches up where the host next reads a result (the step agreement's read, the step's one
// wait for the device), which lands in "other".
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
// pause() and resume().
class PhaseTimer {
 public:
  explicit PhaseTimer(double& phase) : phase_(phase) {}
  ~PhaseTimer() { pause(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  void pause() {
    if (running_) phase_ += lap_.lap();
    running_ = false;
  }
  void resume() {
    lap_.lap();
    running_ = true;
  }

 private:
  double& phase_;
  Lap lap_;
  bool running_ = true;
};

}  // namespace sana::train
