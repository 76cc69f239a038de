// How much device memory one training process needs for a config, before launching:
// weights, gradients, optimizer state and EMA counted from the model's parameter shapes
// (the optimizer's own rule for which tensors keep factored statistics), and the
// activations that autograd keeps for the backward pass measured, not modelled: the
// model is built at depth 1 and 2 on the CPU, one forward at a small bucket is run under
// a counting allocator at two token counts, and the bytes held after it (per image token
// and per sample, per block and outside the blocks) are scaled to the config's depth,
// largest bucket and micro-batch. With gradient
// checkpointing the blocks keep only their inputs, and one block's activations are
// recomputed at a time during the backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sana/config/config.h"
#include "sana/model/spec.h"

namespace sana::train {

// What one rank keeps of the run's state, in bytes (memory.json's static fields).
struct RankState {
  int rank = 0;
  double weights = 0, gradients = 0, optimizer = 0, ema = 0;
  // ZeRO stage 3: other ranks' parameters held at once, at the most (an upper bound: the
  // outside of the blocks with two neighbouring blocks).
  double gathered = 0;
};

struct MemoryEstimate {
  int64_t parameters = 0;
  int world_size = 1;
  int64_t zero_stage = 0;
  // The rank that keeps the most (what every GPU must hold); `ranks` has every rank's.
  double weights = 0, gradients = 0, optimizer = 0, ema = 0, gathered = 0;  // bytes
  std::vector<RankState> ranks;
  std::string optimizer_name;
  int64_t height = 0, width = 0, tokens = 0, micro_batch = 0;  // the largest bucket
  double activations = 0;               // bytes kept for the backward, fp32
  double activations_checkpointed = 0;  // the same with train.grad_checkpointing (and its gc_step)
  bool checkpointing = false;           // the config's train.grad_checkpointing
  // The config trains under bf16/fp16 autocast on CUDA: most saved activations are half as
  // large there. Not measured (CPU autocast keeps other tensors than CUDA's): the fp32
  // figures are the upper bound.
  bool autocast = false;
  // What the config's run needs: state + its activations (checkpointed or not), fp32.
  double total() const;
  double activations_for_config() const;
};

// On `world_size` processes (train.zero_stage splits the state over them). Throws
// SpecError / UsageError for a config whose model cannot be built.
MemoryEstimate estimate_memory(const config::Config& cfg, int world_size = 1);

// The measurement itself: bytes the CPU allocator holds after one forward (graph kept) of
// `batch` samples of h x w tokens through `spec` cut to `depth` blocks, with every
// `checkpoint_every`-th block checkpointed (0: none).
double held_after_forward(const model::ModelSpec& spec, int64_t depth, int64_t h_tokens, int64_t w_tokens,
                          int64_t batch, int64_t checkpoint_every);

}  // namespace sana::train
