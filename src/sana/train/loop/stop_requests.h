// What asks the run to stop on this rank: SIGINT or SIGTERM, and train.early_stop_hours
// passed since start-up. The next step's agreement carries a request to every rank, which
// all stop after that step with a checkpoint.
//
// Owns: the signal handlers, the start-up time, and whether the run stopped on a request.
// Never: stops anything itself (the step agreement decides, the loop ends).
#pragma once

#include <chrono>

namespace sana::train {

class StopRequests {
 public:
  // `early_stop_hours`: train.early_stop_hours (0: none), counted from now.
  explicit StopRequests(double early_stop_hours) : hours_(early_stop_hours) {}

  // From now on SIGINT and SIGTERM ask for a stop (before, they end the process).
  static void watch_signals();

  bool signalled() const;
  bool out_of_time() const;
  double early_stop_hours() const { return hours_; }
  // The loop ended after a step a rank asked to stop after.
  void stopped() { stopped_ = true; }
  bool was_stopped() const { return stopped_; }

 private:
  double hours_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  bool stopped_ = false;
};

}  // namespace sana::train
