// A step's phases timed on the device: on CUDA the host's phase timers (step_times.h) are
// asynchronous, a kernel's work lands wherever the host next waits, so each phase boundary
// also records an event on the compute stream, and the time between two events is the
// device's time in the phase the first one opened (its idle time while the host prepares
// the next work included: the device's timeline, which adds up to its step). The events are
// read once the device has passed them (never waiting): a step's device times arrive at a
// later step's record, named by their step.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "sana/train/step/step_times.h"

namespace sana::train {

class DeviceTimeline : public PhaseMarks {
 public:
  // Where the marks go: CUDA events on the current stream (cuda_events()), or the host's
  // steady clock (tests: the attribution without a GPU).
  class Clock {
   public:
    virtual ~Clock() = default;
    virtual int mark() = 0;                      // a mark now, in stream order: its id
    virtual bool passed(int id) = 0;             // the device is past it (never waits)
    virtual double seconds(int from, int to) = 0;  // between two passed marks
    virtual void release(int id) = 0;            // the id may be handed out again
  };
  static std::unique_ptr<Clock> cuda_events();  // device_timeline_cuda.cpp
  static std::unique_ptr<Clock> host_clock();

  explicit DeviceTimeline(std::unique_ptr<Clock> clock);

  // While it lives, the thread's PhaseTimers mark this timeline.
  class Active {
   public:
    explicit Active(DeviceTimeline& t) : saved_(PhaseMarks::current()) { PhaseMarks::current() = &t; }
    ~Active() { PhaseMarks::current() = saved_; }
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;

   private:
    PhaseMarks* saved_;
  };

  void enter(Phase phase) override;
  void leave(Phase phase) override;
  // Step `step` ends here: the work queued since the previous step's end is its own.
  void end_step(int64_t step);

  struct Finished {
    int64_t step = 0;
    StepTimes times;  // total: from the previous step's end mark (the first step's: its first mark)
  };
  // The ended steps whose end the device has passed, oldest first, handed over once.
  std::vector<Finished> take_finished();

 private:
  struct Mark {
    int id;
    Phase phase;  // what the device does from this mark on; null: no phase ("other")
  };
  void add_mark();

  std::unique_ptr<Clock> clock_;
  std::vector<Phase> open_;  // entered and not left, innermost last
  std::deque<Mark> marks_;   // from the oldest unfinished step's start (the previous end)
  std::deque<std::pair<int64_t, size_t>> ends_;  // ended steps: number, index of the end mark
};

}  // namespace sana::train
