// Data-parallel gradient synchronisation, overlapped with the backward pass (our own
// engine rather than c10d::Reducer, whose C++ API is internal and differs between 1.13
// and 2.x; scripts/bench_ddp.sh measures the overlap). Gradients are grouped into buckets
// (a small first one, then up to ddp.bucket_cap_mb, in reverse registration order, which
// is roughly the order backward produces them). A post-hook on each parameter's gradient
// accumulator marks it ready; a full bucket is flattened and its asynchronous all-reduce
// starts at once, always in bucket order, so every rank issues the same collectives in
// the same order. finish() zero-fills gradients that never arrived (unused parameters,
// named in one warning), starts what is left, waits for all, and divides by the world
// size: the result is the mean gradient over the global batch on every rank.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "sana/dist/runtime.h"

namespace sana::train {

class GradSync {
 public:
  // params: (name, tensor) in registration order; buckets in reverse order.
  // overlap false: nothing starts before finish() (for measuring what overlap gains).
  GradSync(dist::Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
           double bucket_cap_mb = 25.0, double first_bucket_mb = 1.0, bool overlap = true);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Before each backward: whether this backward ends the optimizer step (the last
  // micro-step syncs; earlier ones only accumulate, like DDP's no_sync).
  void begin_backward(bool sync);
  // After the last micro-step's backward: every gradient averaged over all ranks.
  void finish();

  size_t bucket_count() const { return buckets_.size(); }
  std::vector<std::vector<std::string>> bucket_names() const;
  // Parameters that got no gradient in some step so far (zero-filled).
  const std::set<std::string>& unused() const { return warned_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    size_t pending = 0;
    torch::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
    bool launched = false;
  };
  friend struct ReadyHook;
  // What the hooks reach; cleared when this object goes, since the hooks stay on the
  // parameters' accumulators as long as the parameters live.
  struct Target {
    std::mutex mutex;
    GradSync* sync = nullptr;
  };
  void mark_ready(size_t param);
  void launch_ready_in_order();  // mutex held
  void launch(Bucket& b);

  dist::Runtime& rt_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooks alive
  std::vector<char> ready_;
  std::shared_ptr<Target> target_;
  bool overlap_ = true;
  std::mutex mutex_;
  size_t next_launch_ = 0;
  bool syncing_ = false;
  std::set<std::string> warned_;
};

}  // namespace sana::train
