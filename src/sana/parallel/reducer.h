// Data-parallel gradient synchronisation, overlapped with the backward pass (our own
// engine rather than c10d::Reducer, whose C++ API is internal and differs between 1.13
// and 2.x; scripts/bench/ddp_engine.sh measures the overlap). Gradients are grouped into buckets
// by compute_buckets() (bucket_assignment.h: a small first one, then up to
// ddp.bucket_cap_mb, in reverse registration order, which is roughly the order backward
// produces them). Each parameter's .grad is a view into its bucket's flat tensor (as DDP's
// gradient_as_bucket_view): autograd accumulates into it in place, so nothing is copied
// into or out of the buckets, and the gradient norm, clipping and zeroing run over a few
// flat tensors instead of every parameter. A post-hook on each parameter's gradient
// accumulator marks it ready; a bucket whose gradients are all ready starts its
// asynchronous all-reduce at once, always in bucket order, so every rank issues the same
// collectives in the same order. finalize() names parameters that got no gradient (once;
// their zero gradient is synced like the rest), starts what is left, waits for all, and
// (ReducerOptions::average) divides by the world size. Exact mode (train.deterministic)
// trades the overlap for integer sums that no world size or accumulation split changes
// (docs/deterministic.md).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/util/stateful.h"
#include "sana/parallel/bucket_assignment.h"
#include "sana/distributed/options.h"
#include "sana/parallel/options.h"
#include "sana/distributed/runtime.h"
#include "sana/parallel/shard_plan.h"

namespace sana::parallel {

// One optimizer step's gradient reduction, driven from outside:
//   for each micro-step: begin_backward(last micro-step?); loss.backward();
//   then finalize(); then the optimizer step.
// One bucket's parameters and gradients as two flat tensors of the same layout: each
// parameter of `layout.params` (indices into make_reducer()'s params) is a view of
// `params` at its offset, its gradient a view of `grads`. Optimizers update a whole bucket
// with a few operations over these.
struct FlatBucket {
  torch::Tensor params, grads;
  GradBucket layout;
};

// add_gradient() is what the autograd post-hooks call; callers never need to.
// A stateful part ("reducer"): train.deterministic's scales go into checkpoints.
class Reducer : public Stateful {
 public:
  virtual ~Reducer() = default;
  // Before each backward: whether this backward ends the optimizer step (the last
  // micro-step syncs; earlier ones only accumulate, like DDP's no_sync). Points every
  // parameter's .grad at its bucket view (keeping its value) if something replaced it.
  virtual void begin_backward(bool sync) = 0;
  // Parameter `param` (an index into make_reducer()'s params) has its gradient for this
  // backward. Ignored unless the backward syncs; a second call in one step is ignored.
  virtual void add_gradient(size_t param) = 0;
  // After the last micro-step's backward: every gradient averaged (or summed) over all
  // ranks (reduce()), then what a wrapper set to follow it (after_finalize).
  void finalize() {
    reduce();
    if (after_finalize_) after_finalize_();
  }
  // What follows every finalize(), set by a wrapper from outside the loop (ZeRO stage 3
  // releases the gathered parameters the step's backward still holds); empty: nothing.
  void after_finalize(std::function<void()> f) { after_finalize_ = std::move(f); }
  virtual size_t bucket_count() const = 0;
  // The gradients this rank keeps after finalize(), each element once (norms, scaling and
  // zeroing run over these): every bucket's flat tensor, or with sharded gradients this
  // rank's segments of each bucket that has some (one tensor per such bucket, views of one
  // buffer: on one process the same tensors, element for element, as unsharded).
  virtual std::vector<torch::Tensor> flat_gradients() const = 0;
  // dist.elastic continue, after the survivors of a lost rank re-formed (Runtime::regroup):
  // the interrupted step's collectives are abandoned unwaited, every gradient is zero in
  // new buckets (the old group's collectives may still write into the old ones:
  // flat_gradients() changes), and the shard plan is the new world's. Whole (unsharded,
  // non-exact) gradients only.
  virtual void regroup() = 0;
  // dist.elastic continue, when the trainer is built anew for the survivors (ZeRO): the
  // collectives in flight are dropped unwaited (the old backend keeps their buffers) rather
  // than waited for, up to the old group's timeout, as the reducer goes.
  virtual void abandon() {}
  // Every gradient to zero (after the optimizer step); with sharded gradients every
  // parameter's .grad is undefined until its next backward.
  virtual void zero_gradients() = 0;
  // Which rank owns which parameters (ZeRO; computed for any stage).
  virtual const ShardPlan& shard_plan() const = 0;
  // ReducerOptions::shard_gradients in effect: flat_gradients() holds only this rank's
  // segments, so a norm over it is this rank's part.
  virtual bool gradients_sharded() const = 0;
  // ReducerOptions::gradients_on_host in effect: flat_gradients() are in host memory (and
  // gradients_sharded() is true, at any process count).
  virtual bool gradients_on_host() const { return false; }
  // After finalize(): the reduced gradient of segment `segment` of bucket `bucket`, owned
  // by this rank (a view that stays valid across steps).
  virtual torch::Tensor segment_gradient(size_t bucket, size_t segment) const = 0;
  // Makes every parameter a view into a flat tensor per bucket (values kept; the
  // parameters stay the same leaf tensors, so modules, hooks and checkpoints see no
  // change) and returns the buckets. Once per reducer; only for one reducer of a model.
  virtual std::vector<FlatBucket> flatten_parameters() = 0;
  // Exact mode: whether the last finalize() found a gradient too large for the accumulator
  // on some rank (every rank sees the same answer). The gradients are then zero and the
  // scales lowered: the step's micro-batches must run their backward again.
  virtual bool overflowed() const { return false; }
  // Exact mode: each bucket's scale exponent (kept in checkpoints for a bitwise resume).
  virtual std::vector<int64_t> exact_scales() const { return {}; }
  virtual void set_exact_scales(const std::vector<int64_t>& /*scales*/) {}

  std::string state_name() const override { return "reducer"; }
  PartState save_state() const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 protected:
  // finalize()'s reduction.
  virtual void reduce() = 0;

 private:
  std::function<void()> after_finalize_;
};


// The bucketed, overlapped all-reduce over every parameter of `params`: (name, tensor) in
// registration order, each a leaf that requires grad (std::invalid_argument otherwise:
// pass only trainable parameters). Hooks stay on the parameters' gradient accumulators
// after the reducer goes, but reach nothing then; a reducer told begin_backward(false)
// ignores them, so two reducers may share parameters if only one syncs a given backward.
std::unique_ptr<Reducer> make_reducer(dist::Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                      ReducerOptions opts = {});

}  // namespace sana::parallel
