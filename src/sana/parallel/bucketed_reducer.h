// The reducer's engine (reducer.h's make_reducer): one flat tensor and one asynchronous
// all-reduce per bucket of compute_buckets()'s assignment. Private to parallel/: reducer.cpp
// holds the overlapped reduction, sharded gradients and streaming to the host;
// reducer_exact.cpp train.deterministic's integer sums.
#pragma once

#include <torch/torch.h>

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sana/parallel/accumulator_hooks.h"
#include "sana/parallel/reducer.h"

namespace sana::parallel::detail {

// The overlapped engine: executes compute_buckets()'s assignment with one flat tensor and
// one asynchronous all-reduce per bucket.
class BucketedReducer : public Reducer {
 public:
  BucketedReducer(dist::Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params, const ReducerOptions& opts);
  ~BucketedReducer() override;
  BucketedReducer(const BucketedReducer&) = delete;
  BucketedReducer& operator=(const BucketedReducer&) = delete;

  void begin_backward(bool sync) override;
  void regroup() override;
  void abandon() override;
  void add_gradient(size_t param) override;
  void reduce() override;
  size_t bucket_count() const override { return buckets_.size(); }
  std::vector<torch::Tensor> flat_gradients() const override;
  void zero_gradients() override;
  std::vector<FlatBucket> flatten_parameters() override;
  const ShardPlan& shard_plan() const override { return plan_; }
  bool gradients_sharded() const override { return shard_; }
  bool gradients_on_host() const override { return on_host_; }
  torch::Tensor segment_gradient(size_t bucket, size_t segment) const override;
  bool overflowed() const override { return overflowed_; }
  std::vector<int64_t> exact_scales() const override;
  void set_exact_scales(const std::vector<int64_t>& scales) override;

 private:
  // Exact mode: one bucket's integer accumulator (its elements, then two counters: ranks'
  // micro-batches that overflowed, and that were not finite) and scale exponent.
  struct Exact {
    torch::Tensor acc;
    int64_t scale = 32;
  };
  void absorb();          // the flat gradients into the accumulators; flats zeroed
  void finalize_exact();
  struct Bucket {
    GradBucket plan;
    size_t pending = 0;
    torch::Tensor flat;  // undefined while released (sharded gradients)
    std::vector<dist::PendingCollective> works;  // one all-reduce, or one reduce per segment
    bool harvested = false;
  };
  void launch(size_t bucket);    // mutex_ held
  void launch_ready_in_order();  // mutex_ held
  void bind_gradients();         // mutex_ held
  // Sharded gradients (mutex_ held):
  void allocate(size_t bucket);     // the bucket's flat tensor, zero, and its parameters' views
  void bind_lazily(size_t param);   // the parameter's new gradient into its bucket
  void harvest(size_t bucket);      // waits; owned segments into owned_; the bucket released
  void harvest_completed();         // harvest() for the launched buckets already reduced

  dist::Runtime& rt_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<torch::Tensor> grad_views_;  // per parameter: its shape over its bucket's slice
  std::vector<char> ready_;
  std::optional<AccumulatorHooks> hooks_;  // add_gradient() as each gradient arrives
  bool overlap_ = true;
  bool average_ = true;
  bool exact_ = false;
  std::vector<Exact> exact_state_;
  bool unabsorbed_ = false;  // a backward ran since the last absorb()
  bool overflowed_ = false;
  std::mutex mutex_;
  size_t next_launch_ = 0;
  bool syncing_ = false;
  std::set<std::string> warned_;  // parameters already named in the no-gradient warning
  ShardPlan plan_;
  bool shard_ = false;
  bool on_host_ = false;  // ReducerOptions::gradients_on_host: owned_ in host memory
  // Each segment reduced to its owner (NCCL), or the whole bucket all-reduced as at stage 0
  // and only the owned segments kept (Gloo: the same sums as stage 0, to the last bit).
  bool reduce_to_owners_ = false;
  torch::Tensor owned_;                            // this rank's segments, end to end
  std::vector<std::vector<int64_t>> owned_at_;     // per bucket and segment: its offset in owned_, or -1
  std::vector<torch::Tensor> owned_views_;         // per owned parameter: its gradient in owned_
  size_t next_harvest_ = 0;
};

}  // namespace sana::parallel::detail
