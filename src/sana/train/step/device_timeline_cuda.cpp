// DeviceTimeline's marks as CUDA events on the current stream (timing enabled), from a pool
// so that a step's few hundred marks create no events after the first steps.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include <memory>
#include <vector>

#include "sana/train/step/device_timeline.h"

namespace sana::train {

namespace {

class CudaEvents : public DeviceTimeline::Clock {
 public:
  int mark() override {
    int id;
    if (free_.empty()) {
      id = static_cast<int>(events_.size());
      events_.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    } else {
      id = free_.back();
      free_.pop_back();
    }
    events_[static_cast<size_t>(id)]->record(at::cuda::getCurrentCUDAStream());
    return id;
  }
  bool passed(int id) override { return events_.at(static_cast<size_t>(id))->query(); }
  double seconds(int from, int to) override {
    return events_.at(static_cast<size_t>(from))->elapsed_time(*events_.at(static_cast<size_t>(to))) / 1000.0;
  }
  void release(int id) override { free_.push_back(id); }

 private:
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events_;
  std::vector<int> free_;
};

}  // namespace

std::unique_ptr<DeviceTimeline::Clock> DeviceTimeline::cuda_events() { return std::make_unique<CudaEvents>(); }

}  // namespace sana::train
