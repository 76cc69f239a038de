#include "sana/train/step/device_timeline.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace sana::train {

namespace {

// Marks as host times: every mark is passed at once.
class HostClock : public DeviceTimeline::Clock {
 public:
  int mark() override {
    const int id = next_++;
    at_[id] = std::chrono::steady_clock::now();
    return id;
  }
  bool passed(int) override { return true; }
  double seconds(int from, int to) override { return std::chrono::duration<double>(at_.at(to) - at_.at(from)).count(); }
  void release(int id) override { at_.erase(id); }

 private:
  int next_ = 0;
  std::map<int, std::chrono::steady_clock::time_point> at_;
};

}  // namespace

std::unique_ptr<DeviceTimeline::Clock> DeviceTimeline::host_clock() { return std::make_unique<HostClock>(); }

DeviceTimeline::DeviceTimeline(std::unique_ptr<Clock> clock) : clock_(std::move(clock)) {}

void DeviceTimeline::add_mark() { marks_.push_back({clock_->mark(), open_.empty() ? nullptr : open_.back()}); }

void DeviceTimeline::enter(Phase phase) {
  open_.push_back(phase);
  add_mark();
}

void DeviceTimeline::leave(Phase phase) {
  // The innermost open span of the phase (timers are scoped, so it is the last).
  const auto it = std::find(open_.rbegin(), open_.rend(), phase);
  if (it == open_.rend()) return;
  open_.erase(std::next(it).base());
  add_mark();
}

void DeviceTimeline::end_step(int64_t step) {
  add_mark();
  ends_.emplace_back(step, marks_.size() - 1);
}

std::vector<DeviceTimeline::Finished> DeviceTimeline::take_finished() {
  std::vector<Finished> out;
  while (!ends_.empty() && clock_->passed(marks_[ends_.front().second].id)) {
    const auto [step, end] = ends_.front();
    ends_.pop_front();
    Finished f{step, {}};
    for (size_t i = 0; i < end; ++i) {
      const double s = clock_->seconds(marks_[i].id, marks_[i + 1].id);
      if (marks_[i].phase != nullptr) f.times.*(marks_[i].phase) += s;
      f.times.total += s;
    }
    out.push_back(f);
    // The end mark stays: the next step's start.
    for (size_t i = 0; i < end; ++i) clock_->release(marks_[i].id);
    marks_.erase(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(end));
    for (auto& e : ends_) e.second -= end;
  }
  return out;
}

}  // namespace sana::train
