// train.offload_optimizer (ZeRO-Offload's design, docs/memory.md): the optimizer and the
// fp32 master weights of this rank's share live in host memory. The device keeps its
// working weights; the reducer streams each bucket's reduced gradient segments into host
// buffers as the backward produces them (ReducerOptions::gradients_on_host), which are
// this optimizer's gradients. (Where the reducer keeps them on the device, train.
// deterministic's integer sums, each step copies them into host buffers of the same flat
// layout.) The inner optimizer (any train.optimizer.type) updates the masters on the host,
// and the masters are copied back into the device's owned segments (which ZeRO then
// broadcasts as always). On a CPU run the copies are plain
// memory copies and the maths is the same operations on the same values, so an offloaded
// run trains bitwise as a device-resident one (dist.offload checks it).
// The optimizer state (state(), checkpoints) is the inner optimizer's, under the same names,
// so a checkpoint resumes with offloading on or off, at any process count.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "sana/train/optim/optimizer.h"

namespace sana::train {

class HostOptimizer : public Optimizer {
 public:
  // `params`: the parameters this rank updates (parallel::Zero::owned()); `buckets`: their
  // flat buckets on the device (Zero::optimizer_buckets(), layout indices into `params`),
  // which must cover every parameter. `gradients_on_host`: the buckets' gradients are in
  // host memory already (the reducer's), used as they are. Copies the current weights into
  // the masters.
  HostOptimizer(const OptimizerOptions& options, const NamedParams& params, std::vector<parallel::FlatBucket> buckets,
                bool gradients_on_host);

  void apply(double lr) override;
  const char* name() const override { return inner_->name(); }
  NamedParams state() const override { return inner_->state(); }
  void load_state(const NamedParams& state) override { inner_->load_state(state); }
  // The buckets came with the constructor.
  void use_flat_buckets(std::vector<parallel::FlatBucket> /*buckets*/) override {}
  // The device weights were set from outside (a resume, model.load_from): the masters take them.
  void weights_changed() override;
  void sum_parameters_with(SumOverParameters sum) override { inner_->sum_parameters_with(std::move(sum)); }
  NamedParams eval_weights() const override { return inner_->eval_weights(); }  // host tensors
  bool has_eval_weights() const override { return inner_->has_eval_weights(); }
  // Host memory kept besides the state: the master weights and their gradient buffers.
  std::vector<torch::Tensor> host_weights() const override;
  std::vector<torch::Tensor> host_gradients() const override;
  bool on_host() const override { return true; }

 private:
  std::vector<parallel::FlatBucket> device_;  // this rank's segments on the device
  std::vector<parallel::FlatBucket> host_;    // the masters and their gradients, same layout
  bool copy_gradients_ = true;                // the gradients are device_'s, copied each step
  NamedParams masters_;                       // per parameter: views of host_'s flat tensors
  std::unique_ptr<Optimizer> inner_;
};

}  // namespace sana::train
