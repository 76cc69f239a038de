// How much device memory one training process needs for a config, before launching:
// weights, gradients, optimizer state and EMA counted from the model's parameter shapes
// (the optimizer's own rule for which tensors keep factored statistics), split over the
// ranks as train.zero_stage splits them, and the memory a step's forward and backward need
// measured, not modelled: the model is built at depth 1 and 2 on the CPU, one forward and
// backward at a small bucket is run under a counting allocator (counting_allocator.h) at
// two token counts, and the peak above the start (per image token and per sample, per block
// and outside the blocks) is scaled to the config's depth, largest bucket and micro-batch.
// With gradient checkpointing the blocks keep only their inputs, and one block's
// activations are recomputed at a time during the backward.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/model/lora_options.h"
#include "sana/model/spec.h"
#include "sana/model/storage_dtype.h"
#include "sana/parallel/options.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/sprint/objective.h"

namespace sana::train {

// What one rank keeps of the run's state, in bytes (memory.json's static fields).
struct RankState {
  int rank = 0;
  double weights = 0, gradients = 0, optimizer = 0, ema = 0;
  // ZeRO stage 3: other ranks' parameters held at once, at the most (an upper bound: the
  // outside of the blocks with two neighbouring blocks).
  double gathered = 0;
  // train.working_weights under CUDA autocast: the half copies of the trained Linear and
  // Conv2d weights kept between optimizer steps (model/working_weights.h).
  double working = 0;
  // In host memory (train.offload_optimizer: the fp32 master weights, their gradient buffers
  // and the optimizer state of this rank's share; train.ema_device cpu: the EMA). The device
  // fields then leave them out.
  double host_weights = 0, host_gradients = 0, host_optimizer = 0, host_ema = 0;
  // dist.elastic continue under ZeRO: the mirror of the previous rank's share (its
  // parameters, gradients, optimizer state and EMA; train/elastic/share_mirror.h), on the device
  // but for an EMA kept in host memory.
  double mirror = 0, host_mirror = 0;
  // train.offload_blocks: the swapped blocks' weights, in host memory (page-locked on a GPU;
  // model/swapped_blocks.h): a frozen base's, or in a full fine-tune the reducer's buckets of
  // the swapped blocks. `weights` then leaves them out.
  double host_blocks = 0;
  double host_total() const {
    return host_weights + host_gradients + host_optimizer + host_ema + host_mirror + host_blocks;
  }
};

struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t trainable = 0;  // under train.lora the adapters' elements, a ControlNet's control blocks', else `parameters`
  std::string trained;    // "" when every parameter trains, else "adapters" or "control blocks"
  int64_t frozen = 0;     // the frozen base's elements
  int world_size = 1;
  int64_t zero_stage = 0;
  // The rank that keeps the most (what every GPU must hold); `ranks` has every rank's.
  double weights = 0, gradients = 0, optimizer = 0, ema = 0, gathered = 0, working = 0;  // bytes
  // That rank's host memory for the run's state (RankState's host fields).
  double host_weights = 0, host_gradients = 0, host_optimizer = 0, host_ema = 0;
  double mirror = 0, host_mirror = 0, host_blocks = 0;  // RankState's
  double host_total() const {
    return host_weights + host_gradients + host_optimizer + host_ema + host_mirror + host_blocks;
  }
  // train.offload_blocks: how many blocks swap, the swapped blocks on the device at once
  // (transient: with gradient checkpointing two, the one computing and the one copied ahead;
  // without, all of them, whose weights autograd keeps for the backward), and the bytes
  // copied to the device per micro-batch (each swapped block once for the forward and once
  // for the backward).
  int64_t swapped_blocks = 0;
  double swapped_in = 0, swap_copies = 0;
  // A frozen base stored in less than fp32: what restoring the largest layer's weight to
  // fp32 takes while that layer computes (transient, one layer at a time; NF4 adds its byte
  // indices: model/frozen_storage.h's StorageReport::transient).
  double converted = 0;
  // Gradients kept off the device's buckets (train.offload_optimizer streams them to the
  // host; ZeRO 2 keeps the reduced segments): the buckets the backward fills and reduces at
  // once, counted as two of the largest (one filling, one in reduction).
  double in_flight = 0;
  model::StorageDtype frozen_dtype = model::StorageDtype::fp32;
  std::vector<RankState> ranks;
  std::string optimizer_name;
  int64_t height = 0, width = 0, tokens = 0, micro_batch = 0;  // the largest bucket
  // The rise of memory during a step's forward and backward, fp32 (the activations kept for
  // the backward and the backward's working memory at its peak), and the same with
  // train.grad_checkpointing (and its gc_step). SANA-Sprint's stage 2: a generator step's
  // graphs held at once, composed from the student's flow terms (memory_estimate.cpp's
  // add_stage2_graphs).
  double activations = 0;
  double activations_checkpointed = 0;
  // What they are made of, per sample (bytes): outside the blocks and per block, each also
  // per image token; so any bucket and micro-batch can be estimated (the tests do).
  std::map<std::string, double> terms, terms_checkpointed;
  bool checkpointing = false;           // the config's train.grad_checkpointing
  // The config trains under bf16/fp16 autocast on CUDA: most saved activations are half as
  // large there. Not measured (CPU autocast keeps other tensors than CUDA's): the fp32
  // figures are the upper bound.
  bool autocast = false;
  // SANA-Sprint's stage 2: the frozen teacher's weights (in frozen_dtype) and the
  // discriminator heads' weights, gradients and optimizer state (whole on every rank).
  double teacher = 0, heads = 0;
  int64_t teacher_parameters = 0, heads_parameters = 0;
  // What the config's run needs: state + its activations (checkpointed or not), fp32.
  double total() const;
  double activations_for_config() const;
};

// What the estimate reads of a run, by the keys (train/options/torch_options.h fills it).
struct MemoryEstimateOptions {
  model::ModelSpec spec;
  std::optional<model::LoraOptions> lora;  // train.lora when on: the adapters train
  OptimizerOptions optimizer;              // train.optimizer
  bool ema = false;                        // the EMA is kept (train.ema_rate)
  bool ema_on_host = false;                // train.ema_device cpu
  bool offload_optimizer = false;          // train.offload_optimizer
  bool mirror = false;                     // dist.elastic continue: each rank mirrors another's ZeRO share
  parallel::ReducerOptions reducer;        // the bucket caps (ddp.*)
  int64_t zero_stage = 0;                  // train.zero_stage
  bool deterministic = false;              // train.deterministic: gradients stay whole
  bool autocast = false;                   // model.mixed_precision bf16/fp16 on CUDA
  bool working_weights = true;             // train.working_weights (under autocast)
  std::vector<data::BucketTable> buckets;  // the data's bucket tables (the largest bucket counts)
  int64_t micro_batch_size = 1;            // train.micro_batch_size
  int64_t global_batch_size = 0;           // train.global_batch_size (0: one micro-batch a step)
  bool grad_checkpointing = false;         // train.grad_checkpointing
  int64_t gc_step = 1;                     // train.gc_step
  model::StorageDtype frozen_dtype = model::StorageDtype::fp32;  // train.frozen_base_dtype (LoRA's, a ControlNet's base, a teacher)
  double offload_blocks = 0;               // train.offload_blocks (blocks swapped to the host)
  // A SANA-Sprint stage-2 run (model.teacher_model): its teacher, how many heads read it and
  // the step's options (whose passes the activations measure).
  struct Sprint {
    model::ModelSpec teacher;
    int64_t heads = 0;
    SprintOptions step;
  };
  std::optional<Sprint> sprint;
};

// On `world_size` processes (train.zero_stage splits the state over them); without
// `activations` their measurement is skipped (they stay 0). Throws SpecError for adapters
// the model cannot take.
MemoryEstimate estimate_memory(const MemoryEstimateOptions& o, int world_size = 1, bool activations = true);

// The step's activations (fp32) at `micro_batch` with gradient checkpointing of every
// `gc_step`-th block (0: none), from `e`'s measured terms and largest bucket: any setting
// from the one measurement (at the estimate's own settings, its own figures). Not for
// SANA-Sprint's stage 2, whose graphs are composed otherwise.
double activations_at(const MemoryEstimate& e, const model::ModelSpec& spec, int64_t micro_batch, int64_t gc_step);

// The measurement itself: the most bytes the CPU allocator held above its start during one
// forward and backward of `batch` samples of h x w tokens through `spec` cut to `depth`
// blocks (gradients allocated before), every `checkpoint_every`-th block checkpointed (0: none).
double step_peak_bytes(const model::ModelSpec& spec, int64_t depth, int64_t h_tokens, int64_t w_tokens, int64_t batch,
                       int64_t checkpoint_every);
// The same for SANA-Sprint's stage 2: one generator step, then one discriminator step, the
// student `spec` and `sprint`'s teacher cut to `depth` blocks, one head on each of the
// teacher's blocks `sprint.step.head_blocks` (gradients of the student and the heads
// allocated before).
double sprint_step_peak_bytes(const model::ModelSpec& spec, const MemoryEstimateOptions::Sprint& sprint, int64_t depth,
                              int64_t h_tokens, int64_t w_tokens, int64_t batch, int64_t checkpoint_every);

}  // namespace sana::train
