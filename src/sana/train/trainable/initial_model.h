// The model a run starts from, the same on every rank: initialised from train.seed, grown
// from a smaller checkpoint (model_growth) or loaded (model.load_from), a frozen base stored
// in train.frozen_base_dtype, then rank 0's weights broadcast and their checksum agreed. A collective: every rank calls it at the
// same point of start-up.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/distributed/runtime.h"
#include "sana/model/frozen_storage.h"
#include "sana/model/growth_options.h"
#include "sana/model/sana_ms.h"
#include "sana/model/spec.h"
#include "sana/model/swapped_blocks.h"

namespace sana::train {

// Where the model's first weights come from and how it runs (train/options/torch_options.h fills it).
struct InitialModelOptions {
  uint64_t seed = 0;              // train.seed: the initial weights
  model::GrowthOptions growth;    // model_growth (source "" = none)
  std::string growth_strategy;    // model_growth.init_strategy, as the log names it
  std::string load_from;          // model.load_from ("" = none)
  bool load_strict = true;        // model.load_strict
  bool grad_checkpointing = false;  // train.grad_checkpointing
  int64_t gc_step = 1;              // train.gc_step
  bool fused_kernels = false;       // model.kernels: fused
  // A frozen base (train.lora: every parameter; a ControlNet preset's, whatever this says:
  // all but its control blocks; none otherwise): frozen before it reaches the
  // device, its layers stored in `frozen_dtype` there (train.frozen_base_dtype), so the
  // device never holds it in fp32.
  bool frozen_base = false;
  model::StorageDtype frozen_dtype = model::StorageDtype::fp32;
  double offload_blocks = 0;  // train.offload_blocks (model/swapped_blocks.h's swapped_block_ids)
};

model::SanaMS build_initial_model(const InitialModelOptions& o, const model::ModelSpec& spec, dist::Runtime& rt);

// train.offload_blocks: the parameters of the blocks it names, of `net` as built and made
// trainable (every rank's weights agreed), in host memory from now on, swapped in around
// each use (null: none swap). A frozen base's alone; in a full fine-tune (no frozen base)
// every parameter of the block, trained ones too (train.offload_optimizer keeps their
// optimizer in host memory; build the reducer after this).
std::unique_ptr<model::SwappedBlocks> swap_blocks(const InitialModelOptions& o, model::SanaMSImpl& net,
                                                  const torch::Device& device);

// A hash of every parameter's name, shape and bytes, in order: equal on every rank exactly
// when the weights are bitwise equal (start-up and the end of a run compare it).
std::string weights_checksum(const torch::nn::Module& model);
// The same hash over named tensors in the given order (a module's parameters, adapters).
std::string tensors_checksum(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

}  // namespace sana::train
