// ZeRO stage 3's parameters (train.zero_stage 3, docs/memory.md): each segment of the flat
// parameter buckets a tensor only its owner keeps, gathered on every rank while a block that
// uses it runs forward or backward, in fp32 or, under CUDA autocast, as half copies.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sana/parallel/accumulator_hooks.h"
#include "sana/parallel/reducer.h"
#include "sana/distributed/runtime.h"
#include "sana/parallel/shard_plan.h"
#include "sana/model/sana_ms.h"

namespace sana::parallel {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// ZeRO stage 3's parameters: each segment of the flat parameter buckets its own tensor, the
// parameters views of it. A segment another rank owns has no memory unless gathered: the
// forward gathers everything outside the blocks at its start and each block around its
// forward, fetching the next block while one runs; the backward gathers each block when it
// reaches it (or its recompute, under gradient checkpointing), fetching the one before it
// once the one after is released, and releases a block, and the parts outside, once every
// one of their parameters has its gradient. Gathering is one broadcast per segment from its
// owner, started ahead and waited for when the block runs, in the same order on every rank
// (the ranks run the same forwards and backwards: TrainStep pads).
// With a half `compute` dtype (bf16 or fp16 under CUDA autocast, as FSDP's mixed precision)
// a gathered unit is a half copy on every rank, its owner's included: the owner casts its
// fp32 segment, broadcasts the half one, and while the unit is gathered its parameters are
// views of that copy (outside, of the fp32 segments again). Half the bytes gathered and
// sent, and autograd saves the gathered copy itself, which is given back with the unit:
// fp32 parameters under autocast are saved as half casts that outlive the gather.
// The unit a parameter is gathered with, by its name: block k's ("blocks.<k>.", or a LoRA
// adapter's "transformer.transformer_blocks.<k>.") is k + 1; a ControlNet's control block
// j ("controlnet.<j>.") runs inside base block j + 1's hooks (it feeds that block), so it
// is gathered with it: j + 2; everything else (embedders, final layer) is 0, held through
// the whole forward and backward.
size_t gathering_unit(const std::string& parameter_name);

class GatheredParameters : public model::BlockHooks {
 public:
  GatheredParameters(dist::Runtime& rt, const parallel::ShardPlan& plan, std::vector<parallel::FlatBucket>& flat,
                     const NamedParams& params, at::ScalarType compute = at::kFloat);
  ~GatheredParameters() override;
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

  void forward_begins() override;
  void block_forward(int64_t block, bool begins) override;
  void backward_reaches(int64_t block) override;
  void forward_ends(bool backward_follows) override;
  // A parameter's gradient has been accumulated (its accumulator's hook).
  void accumulated(size_t param);
  // After a step's last backward: whatever is still gathered (parameters that got no
  // gradient) is released.
  void step_done();
  // Every segment gathered (`fill`: with its owner's values; else only allocated, to be
  // overwritten) until release_all(): previews, checkpoints, the end. A collective.
  void gather_all(bool fill);
  void release_all();
  const torch::Tensor& segment(size_t bucket, size_t s) const { return segs_[bucket][s].data; }
  int64_t peak_gathered() const { return peak_; }

 private:
  struct Segment {
    torch::Tensor data;       // fp32: the owner's master values (no memory elsewhere unless gathered whole)
    torch::Tensor half;       // half compute: the gathered copy (no memory unless gathered)
    std::vector<std::pair<size_t, int64_t>> members;  // (parameter, offset in the segment)
    int owner = 0;
    int refs = 0;             // holds: the forward's, the backward's (a segment two units share: both)
    dist::PendingCollective pending;  // its broadcast, until finish_gather()
    bool ready = false;       // broadcast done (and, half, its parameters pointed at it)
  };
  // A unit's segments: held (the first hold starts each one's broadcast: a collective every
  // rank joins in the same order), made ready (the broadcasts waited for) and released
  // (the last release gives the memory back).
  void hold(size_t unit);
  void ready(size_t unit);
  void release(size_t unit);
  // Holds for the forward / the backward that fetch ahead (GatheredParameters' .cpp says when).
  void fetch_for_forward(size_t unit);
  void fetch_for_backward(size_t unit);
  void start_gather(Segment& seg);
  void finish_gather(Segment& seg);
  void give_back(Segment& seg);
  // The whole model's gather (fp32, at once): another rank's segment gets memory (and, with
  // `fill`, its owner's values: a collective); drop() gives it back.
  void acquire(Segment& seg, bool fill);
  void drop(Segment& seg);
  // Memory for a gathered tensor and back, counted in the gathered bytes.
  void take(torch::Tensor& t);
  void untake(torch::Tensor& t);
  // The segment's parameters as views of `to` (its fp32 data or its half copy).
  void point(const Segment& seg, const torch::Tensor& to);
  dist::Runtime& rt_;
  NamedParams params_;
  bool half_ = false;
  std::vector<std::vector<Segment>> segs_;
  std::vector<std::vector<std::pair<size_t, size_t>>> unit_segments_;  // per unit: (bucket, segment)
  std::vector<size_t> unit_of_;          // per parameter
  std::vector<int64_t> unit_params_;     // parameters per unit
  std::vector<int64_t> unit_done_;       // of them with a gradient in this backward
  std::vector<char> held_;               // per unit: held for the backward (until its gradients are all in)
  std::vector<char> forward_;            // per unit: held for the forward (a block: while it or the one before runs)
  bool whole_ = false;
  int64_t gathered_ = 0, peak_ = 0;      // bytes of other ranks' segments held
  std::optional<parallel::AccumulatorHooks> hooks_;  // accumulated() as each gradient arrives
};

}  // namespace sana::parallel
