#include "sana/model/swapped_blocks.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <cmath>

namespace sana::model {

std::vector<int64_t> swapped_block_ids(double offload_blocks, int64_t depth) {
  if (offload_blocks < 0) throw SpecError("train.offload_blocks", "is negative: give a count of blocks, or 0 for none");
  const auto n = offload_blocks < 1 ? static_cast<int64_t>(std::floor(offload_blocks * static_cast<double>(depth)))
                                    : static_cast<int64_t>(offload_blocks);
  if (n > depth || (offload_blocks >= 1 && offload_blocks != std::floor(offload_blocks))) {
    throw SpecError("train.offload_blocks", fmt::format("is {:g}: give a count of blocks up to the model's {} (or a "
                                                        "fraction below 1)",
                                                        offload_blocks, depth));
  }
  std::vector<int64_t> ids;
  for (int64_t k = depth - n; k < depth; ++k) ids.push_back(k);
  return ids;
}

struct SwappedBlocks::Block {
  int64_t index = 0;
  std::vector<torch::Tensor> params;  // the block's swapped parameters
  std::vector<torch::Tensor> host;    // while on the device: their host memory
  std::vector<torch::Tensor> device;  // while on the device: the copies there
  int64_t ticket = -1;                // while the copy is under way
  int64_t bytes = 0;
};

SwappedBlocks::SwappedBlocks(SanaMSImpl& model, const std::vector<int64_t>& ids, const torch::Device& device,
                             bool trained)
    : model_(model), ids_(ids), copies_(device), trained_(trained) {
  const auto modules = model.blocks->children();
  torch::NoGradGuard no_grad;
  for (const auto k : ids) {
    TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(modules.size()), "SwappedBlocks: no block ", k);
    auto b = std::make_unique<Block>();
    b->index = k;
    std::vector<const c10::TensorImpl*> seen;  // a wrapper registers its base's parameters too
    for (auto& p : modules[static_cast<size_t>(k)]->parameters()) {
      if (p.requires_grad() && !trained) continue;  // adapters stay on the device
      if (std::find(seen.begin(), seen.end(), p.unsafeGetTensorImpl()) != seen.end()) continue;
      seen.push_back(p.unsafeGetTensorImpl());
      b->bytes += static_cast<int64_t>(p.nbytes());
      // The device's memory goes. A trained parameter's copy is pageable: the reducer moves
      // it into a page-locked bucket of its own (pinning it twice would keep both, torch's
      // host allocator caching what it frees).
      p.set_data(copies_.host_copy(p, /*page_locked=*/!p.requires_grad()));
      b->params.push_back(p);
    }
    host_bytes_ += b->bytes;
    largest_ = std::max(largest_, b->bytes);
    blocks_.push_back(std::move(b));
  }
  model_.add_block_hooks(this);
}

// The parameters stay on their host copies: a model whose swapping ends is going too (a
// whole base brought back to the device could not fit where swapping was needed).
SwappedBlocks::~SwappedBlocks() {
  model_.remove_block_hooks(this);
  release_all();
}

bool SwappedBlocks::swapped(const torch::Tensor& t) const {
  for (const auto& b : blocks_) {
    for (const auto& p : b->params) {
      if (p.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
    }
  }
  return false;
}

std::vector<torch::Tensor> SwappedBlocks::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& b : blocks_) out.insert(out.end(), b->params.begin(), b->params.end());
  return out;
}

SwappedBlocks::Block* SwappedBlocks::find(int64_t block) {
  for (auto& b : blocks_) {
    if (b->index == block) return b.get();
  }
  return nullptr;
}

void SwappedBlocks::fetch(Block& b) {
  if (!b.device.empty() || b.params.empty()) return;
  // What the parameters hold now: the host copies made at the start, or the reducer's host
  // buckets (a trained block's, as the last optimizer step left them).
  b.host.clear();
  for (const auto& p : b.params) b.host.push_back(p.variable_data());
  b.device = copies_.start(b.host, b.ticket);
  for (size_t i = 0; i < b.params.size(); ++i) b.params[i].set_data(b.device[i]);
  copied_bytes_ += b.bytes;
  peak_blocks_ = std::max(peak_blocks_, ++on_device_);
}

void SwappedBlocks::ready(Block& b) {
  fetch(b);
  if (b.ticket < 0) return;
  copies_.wait(b.ticket, b.device);
  b.ticket = -1;
}

void SwappedBlocks::release(Block& b) {
  if (b.device.empty()) return;
  ready(b);  // a copy under way ends first: its memory is written to
  for (size_t i = 0; i < b.params.size(); ++i) b.params[i].set_data(b.host[i]);
  b.device.clear();
  b.host.clear();
  --on_device_;
  // Under autocast the half casts of trained weights (leaves that require grad) stay in this
  // thread's cast cache until the forward's autocast ends: every swapped block's copies on
  // the device at once. Dropped as the block goes (each weight is cast once a forward; what
  // autograd saved for the backward keeps its own reference).
  if (trained_) at::autocast::clear_cache();
}

void SwappedBlocks::release_all() {
  for (auto& b : blocks_) release(*b);
}

void SwappedBlocks::release_after_backward() {
  if (callback_queued_) return;
  callback_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] {
    callback_queued_ = false;
    release_all();
  });
}

void SwappedBlocks::forward_begins() {
  release_all();  // what an earlier backward left (one that never reached its blocks)
  if (!blocks_.empty()) fetch(*blocks_.front());
}

void SwappedBlocks::block_forward(int64_t block, bool begins) {
  Block* b = find(block);
  if (begins) {
    if (b) ready(*b);
    if (Block* next = find(block + 1)) fetch(*next);  // while this one computes
  } else if (b) {
    release(*b);
  }
}

void SwappedBlocks::backward_reaches(int64_t block) {
  release_after_backward();
  if (Block* after = find(block + 1)) release(*after);  // its backward is done: this block's output gradient is in
  if (Block* b = find(block)) ready(*b);
  if (Block* before = find(block - 1)) fetch(*before);
}

void SwappedBlocks::forward_ends(bool backward_follows) {
  if (!backward_follows) release_all();
}

}  // namespace sana::model
