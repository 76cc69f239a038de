// Half working copies of the trained weights (train.working_weights): under bf16/fp16
// autocast every product casts its fp32 weight to the half dtype, and autocast's cache only
// lasts one forward, so a step of k micro-batches casts each weight k times, and twice that
// with gradient checkpointing (each recompute casts again). A layer with a WorkingCopy keeps
// the half copy until its weight changes (the optimizer's in-place update moves the tensor's
// version), so each weight is cast once per optimizer step. The product sees the same half
// tensor autocast would have made, and the gradient goes back into the fp32 weight as
// through autocast's cast (converted to fp32): outputs and gradients are bitwise those of
// autocast (tests/unit/model/test_working_weights.cpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace sana::model {

class WorkingCopy {
 public:
  // `weight` as the layer's product takes it: where autocast is on for its device and it is
  // a trained fp32 tensor, the half copy (cast again only if `weight` changed since),
  // differentiable into `weight`; anything else as it is.
  torch::Tensor of(const torch::Tensor& weight);
  int64_t casts() const { return casts_; }  // how many times the copy was made
  int64_t bytes() const { return half_.defined() ? half_.numel() * half_.element_size() : 0; }

 private:
  std::mutex mutex_;  // the forward and a checkpointed recompute run on different threads
  torch::Tensor half_;
  const void* data_ = nullptr;  // the weight the copy was cast from, and its version then
  int64_t version_ = -1;
  int64_t casts_ = 0;
};

// Gives every Linear and Conv2d under `root` whose weight trains a working copy (`on`), or
// takes them away. Returns how many layers hold one.
int64_t use_working_weights(torch::nn::Module& root, bool on);
// Casts and bytes over `root`'s working copies (for the tests and the memory report).
struct WorkingWeightsUse {
  int64_t layers = 0, casts = 0, bytes = 0;
};
WorkingWeightsUse working_weights_use(torch::nn::Module& root);
// The elements the copies of `root`'s Linear and Conv2d weights would hold, for the layers
// `trains` names (the memory estimate, on a model on the meta device).
int64_t working_elements(torch::nn::Module& root, const std::function<bool(const std::string& layer)>& trains);

}  // namespace sana::model
