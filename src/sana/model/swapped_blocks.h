// Block swapping (train.offload_blocks, docs/memory.md): the parameters of some of a
// model's blocks kept in host memory (page-locked on a GPU), each block copied to the
// device just before it computes and let go after: a frozen base's (LoRA, a ControlNet's
// base), or every parameter of the block when it trains too (a full fine-tune under
// train.offload_optimizer).
//  - The forward copies block k + 1 while block k runs (on a side stream on a GPU; the
//    compute stream waits for the copy only when the block starts) and lets block k go when
//    it ends. The backward copies block k when the gradient of its output is ready (its
//    recompute under gradient checkpointing and its backward both use it), starts block
//    k - 1's copy and lets block k + 1 go. When the backward is over (an autograd callback),
//    or a forward ends with none to follow, every block goes.
//  - Letting a block go points its parameters back at their host memory: nothing is copied
//    back, as the forward and backward never change a weight, and outside them the
//    parameters read as ever (checksums, export). A trained block's weights change only in
//    the optimizer step, between backward and forward, while they are in host memory: the
//    reducer keeps such a block's parameters in host buckets of their own (its gradients
//    still come on the device and stream to the host), the host optimizer writes its
//    updates there, and the next fetch copies what is there then. On the CPU the copies are
//    real copies through the same calls, so a swapped run computes what an unswapped one
//    does.
//  - Without gradient checkpointing, autograd keeps views of a block's weights for the
//    backward, so the device memory of a swapped block lives until then (block swapping
//    saves memory with train.grad_checkpointing).
// Installs itself as the model's BlockHooks; never trains, reduces or checkpoints anything.
// A trained parameter changes device at each fetch and release, which makes autograd build
// it a new accumulator: hooks on gradients are the tensor's own (parallel/accumulator_hooks.h).
// Letting a trained block go also empties autocast's cast cache, which would keep the half
// copies of every swapped block's weights until the forward ends.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "sana/model/host_copies.h"
#include "sana/model/sana_ms.h"
#include "sana/model/spec.h"

namespace sana::model {

// The blocks train.offload_blocks swaps: the last N of `depth` blocks (a value below 1: that
// fraction of them, rounded down; 0: none). SpecError for a negative value, a fraction above
// 1 or more blocks than `depth`.
std::vector<int64_t> swapped_block_ids(double offload_blocks, int64_t depth);

class SwappedBlocks : public BlockHooks {
 public:
  // Keeps the frozen parameters of blocks `ids` of `model` (its parameters on `device`), and
  // with `trained` the trained ones too, in host memory from now on (after this is destroyed
  // too: the model is then done with). Build the reducer after this, so that it sees where
  // the parameters are.
  SwappedBlocks(SanaMSImpl& model, const std::vector<int64_t>& ids, const torch::Device& device, bool trained = false);
  ~SwappedBlocks() override;
  SwappedBlocks(const SwappedBlocks&) = delete;
  SwappedBlocks& operator=(const SwappedBlocks&) = delete;

  void forward_begins() override;
  void block_forward(int64_t block, bool begins) override;
  void backward_reaches(int64_t block) override;
  void forward_ends(bool backward_follows) override;

  const std::vector<int64_t>& blocks() const { return ids_; }
  bool trained() const { return trained_; }  // trained parameters swap too
  // Whether `t` is a swapped parameter (kept in host memory between uses).
  bool swapped(const torch::Tensor& t) const;
  // The swapped parameters (outside a forward and backward: their host memory).
  std::vector<torch::Tensor> parameters() const;
  int64_t host_bytes() const { return host_bytes_; }      // the host copies as made
  int64_t copied_bytes() const { return copied_bytes_; }  // host to device so far
  int64_t largest_block_bytes() const { return largest_; }
  // Every block on the device at once, at the most so far (at most two: the one that
  // computes and the one copied ahead).
  int64_t peak_blocks() const { return peak_blocks_; }
  int64_t blocks_on_device() const { return on_device_; }

 private:
  struct Block;
  Block* find(int64_t block);
  void fetch(Block& b);    // starts its copy
  void ready(Block& b);    // the compute waits for it
  void release(Block& b);  // its parameters back at the host copies
  void release_all();
  void release_after_backward();  // once per backward: release_all() when it is over

  SanaMSImpl& model_;
  std::vector<int64_t> ids_;
  std::vector<std::unique_ptr<Block>> blocks_;
  HostCopies copies_;
  int64_t host_bytes_ = 0, copied_bytes_ = 0, largest_ = 0, peak_blocks_ = 0, on_device_ = 0;
  bool trained_ = false;
  bool callback_queued_ = false;
};

}  // namespace sana::model
