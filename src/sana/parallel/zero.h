// ZeRO (train.zero_stage, docs/memory.md): what this rank keeps of the run's parameter
// state. The reducer's buckets and parallel/shard_plan.h's ownership (whole parameters,
// contiguous along the buckets) decide everything:
//  - stage 0: every rank keeps everything (DDP);
//  - stage 1: the optimizer and the EMA see only the parameters this rank owns; after each
//    step every owner broadcasts its updated segments of the flat parameter buckets;
//  - stage 2: as 1, and the reducer keeps only the owned gradients (ReducerOptions::
//    shard_gradients): each bucket is reduced to its owners as soon as it is ready;
//  - stage 3: as 2, and each segment of the parameter buckets is a tensor of its own that
//    only its owner keeps; the others gather it while a block that uses it runs forward
//    or backward (GatheredParameters, driven by the model's BlockHooks calls).
// Checkpoints hold whole per-parameter tensors, as at stage 0: ShardedPart gathers the
// shares to the writing rank and hands each rank its own entries on resume, so a run
// resumes at any process count and any stage.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sana/parallel/reducer.h"
#include "sana/parallel/gathered_parameters.h"
#include "sana/model/sana_ms.h"
#include "sana/distributed/runtime.h"
#include "sana/util/stateful.h"

namespace sana::parallel {

class Zero {
 public:
  // Makes the parameters views of flat buckets (reducer.flatten_parameters()): once per run.
  // At stage 3 `model` is told to gather its parameters (until the Zero goes), in
  // `gather_dtype` (the autocast dtype on CUDA: GatheredParameters), and `reducer` to let
  // them go after each step's backward (Reducer::after_finalize): the loop calls neither.
  Zero(int stage, dist::Runtime& rt, const NamedParams& params, parallel::Reducer& reducer, model::SanaMSImpl& model,
       at::ScalarType gather_dtype = at::kFloat);
  Zero(const ZeroOptions& o, dist::Runtime& rt, const NamedParams& params, parallel::Reducer& reducer,
       model::SanaMSImpl& model, at::ScalarType gather_dtype)
      : Zero(o.stage, rt, params, reducer, model, gather_dtype) {}
  ~Zero();
  Zero(const Zero&) = delete;
  Zero& operator=(const Zero&) = delete;

  int stage() const { return stage_; }
  bool shards_state() const { return stage_ >= 1 && rt_.world_size() > 1; }
  // Whether every forward is collective (stage 3 on more than one rank gathers each block's
  // parameters): then every rank runs as many micro-batches per step as the rank with the
  // most, padding with weightless ones.
  bool forwards_collective() const { return stage_ >= 3 && rt_.world_size() > 1; }
  // The parameters whose optimizer state and EMA this rank keeps, in registration order.
  const NamedParams& owned() const { return owned_; }
  bool owns(const std::string& name) const;
  // Checkpoint entries ("<parameter>" or "<parameter>/<state>"; any other name belongs to
  // no parameter): the rank that owns the entry's parameter under the shard plan (at every
  // stage: it writes the entry to a sharded checkpoint and reads it back), 0 for an entry
  // of no parameter; and the entry's place in the parameters' registration order (after
  // them all for an entry of no parameter).
  int owner_of(const std::string& entry) const;
  int64_t order_of(const std::string& entry) const;
  // Entries named "<parameter>" or "<parameter>/<state>" in the parameters' registration
  // order (gathered shares come in rank order): the files stage 0 writes, byte for byte.
  void sort_by_parameter(NamedTensors& entries) const;
  // The flat buckets the optimizer updates: every bucket at stage 0, else this rank's
  // segments (layout indices into owned()); their gradients are the reducer's
  // (Reducer::segment_gradient() where it shards them: in host memory under
  // ReducerOptions::gradients_on_host).
  std::vector<parallel::FlatBucket> optimizer_buckets() const;
  // Rank `owner`'s segments of the flat buckets, in bucket order: where each lies and its
  // layout, whose parameter indices count that rank's owned parameters (its owned()).
  struct ShareSegment {
    size_t bucket = 0, segment = 0;
    parallel::GradBucket layout;
  };
  std::vector<ShareSegment> share_of(int owner) const;
  // Every trainable parameter's name and shape in registration order, as when the Zero was
  // made (at stage 3 a parameter has no memory while another rank owns it).
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& parameter_shapes() const { return shapes_; }
  // This rank's parameter values of segment `segment` of bucket `bucket` (its own).
  torch::Tensor segment_values(size_t bucket, size_t segment) const;
  // Whether a checkpoint entry ("<parameter>" or "<parameter>/<state>") is a parameter's.
  bool is_parameter_entry(const std::string& entry) const { return index_.count(entry.substr(0, entry.find('/'))) > 0; }
  // dist.elastic continue (stage 0 only), after a regroup: the interrupted step's gradients
  // discarded and the shard plan the new world's (Reducer::regroup); optimizer_buckets()
  // then names the new gradient buckets.
  void regroup();
  // Numbers per owned() parameter (rows of an fp64 host tensor) summed over every
  // trainable parameter, down each column in registration order: the same bits at every
  // world size and stage (each entry is one rank's, the others add zeros). A collective
  // where the state is sharded. An optimizer's SumOverParameters.
  torch::Tensor sum_over_parameters(const torch::Tensor& mine) const;
  // The start line's part: what this rank keeps ("" at stage 0).
  std::string describe(bool deterministic) const;
  // What must follow every optimizer step (Optimizer::after_step): at stages 1 and 2 each
  // owner's updated segments broadcast to every rank (a collective); empty otherwise.
  std::function<void()> after_update();
  // `mine` (entries "<parameter>" or "<parameter>/<state>", or of no parameter) whole on
  // the writing rank (`writer`, rank 0), in the parameters' registration order, as stage 0
  // keeps them: every rank's share gathered there where the state is sharded (a
  // collective), else the writer's own. Empty on the other ranks.
  NamedTensors collect(const std::string& what, NamedTensors mine, bool writer) const;
  // Stage 3: bytes of other ranks' parameters held at the most so far (0 otherwise).
  int64_t peak_gathered() const { return gathered_ ? gathered_->peak_gathered() : 0; }

  // The whole model on every rank while it lives (stage 3; nothing otherwise): a collective.
  class Whole {
   public:
    explicit Whole(Zero& zero, bool fill = true);
    ~Whole();
    Whole(const Whole&) = delete;
    Whole& operator=(const Whole&) = delete;

   private:
    GatheredParameters* gathered_;
  };

 private:
  // After an optimizer step (stages 1 and 2): every segment broadcast from its owner.
  void broadcast_updates();

  int stage_;
  dist::Runtime& rt_;
  parallel::Reducer& reducer_;
  std::vector<parallel::FlatBucket> flat_;
  NamedParams owned_;
  std::vector<int> owned_index_;  // per parameter: its index in owned_, or -1
  std::unordered_map<std::string, size_t> index_;  // parameter name -> registration index
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_;
  model::SanaMSImpl& model_;
  std::unique_ptr<GatheredParameters> gathered_;  // stage 3
};

// The model's part of checkpoints at stage 3: the whole model gathered around its capture
// and its restore (whose values then replace every rank's own).
class WholeModelPart : public Stateful {
 public:
  WholeModelPart(Stateful& inner, Zero& zero) : inner_(inner), zero_(zero) {}
  std::string state_name() const override { return inner_.state_name(); }
  PartState save_state() const override { return inner_.save_state(); }
  // Without gathering: at stage 3 only the owned parameters have memory here.
  PartState save_state_of(const std::function<bool(const std::string&)>& keep) const override {
    return inner_.save_state_of(keep);
  }
  std::optional<PartState> gather_state(bool writer) const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  Stateful& inner_;
  Zero& zero_;
};

// Every rank's `own` tensors on rank 0 (`writer`), in rank order; an empty list elsewhere.
// A collective: every rank calls it with its own share.
NamedTensors gather_to_writer(dist::Runtime& rt, const std::string& what, const NamedTensors& own, bool writer);

// A stateful part whose tensors ("<parameter>" or "<parameter>/<state>") are this rank's
// share under ZeRO (the optimizer, the EMA). gather_state() brings every rank's share to
// the writer, in chunks of at most 64 MiB through the device (one broadcast each), so a
// checkpoint holds what stage 0 would; restore_state() gives the inner part only the
// entries of parameters this rank owns.
class ShardedPart : public Stateful {
 public:
  ShardedPart(Stateful& inner, dist::Runtime& rt, const Zero& zero) : inner_(inner), rt_(rt), zero_(zero) {}
  std::string state_name() const override { return inner_.state_name(); }
  PartState save_state() const override { return inner_.save_state(); }  // this rank's share
  PartState save_state_of(const std::function<bool(const std::string&)>& keep) const override {
    return inner_.save_state_of(keep);
  }
  bool restores_share() const override { return zero_.shards_state(); }
  std::optional<PartState> gather_state(bool writer) const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 private:
  Stateful& inner_;
  dist::Runtime& rt_;
  const Zero& zero_;
};

// The trained state's checkpoint parts as ZeRO keeps them: the trained weights (gathered
// whole at stage 3 around capture and restore), and the EMA and the optimizer (each rank's
// share, whole in the checkpoint). The parts wrapped must outlive them.
struct ShardedState {
  ShardedState(Stateful& trained, Stateful& ema, Stateful& optimizer, dist::Runtime& rt, Zero& zero)
      : weights(trained, zero), ema(ema, rt, zero), optimizer(optimizer, rt, zero) {}
  WholeModelPart weights;
  ShardedPart ema, optimizer;
};

}  // namespace sana::parallel
