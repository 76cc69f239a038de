// Mixed precision on CUDA (model.mixed_precision bf16 / fp16): LibTorch's autocast, whose
// C++ API changed in 2.4 (device-generic calls; sana/torch_compat.h has both). CPU runs stay in
// fp32 (the linear attention is fp32 anyway with model.fp32_attention). The state can be
// captured and re-entered, so a checkpointed block recomputes under the same autocast in
// the backward pass (which runs on autograd's thread, outside the caller's guard).
#pragma once

#include <torch/torch.h>

#include "sana/torch_compat.h"

#include <string>

namespace sana::model {

struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;

  static AutocastState current() { return {compat::cuda_autocast_enabled(), compat::cuda_autocast_dtype()}; }
  void apply() const { compat::set_cuda_autocast(enabled, dtype); }
};

// Enters `state` for its lifetime (restoring the previous one after, and dropping
// autocast's cast cache when leaving an enabled region, as torch.autocast does).
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastState& state) : previous_(AutocastState::current()) {
    state.apply();
    entered_ = state.enabled;
  }
  ~AutocastGuard() {
    previous_.apply();
    if (entered_ && !previous_.enabled) at::autocast::clear_cache();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
  bool entered_ = false;
};

// Autocast off, on CUDA and CPU, for its lifetime: upstream computes LiteLA's products with
// autocast disabled (its attn_matmul), because under fp16 they overflow into NaN losses.
class NoAutocast {
 public:
  NoAutocast() : cuda_(AutocastState::current()), cpu_(compat::cpu_autocast_enabled()) {
    if (cuda_.enabled) compat::set_cuda_autocast(false, cuda_.dtype);
    if (cpu_) compat::set_cpu_autocast(false);
  }
  ~NoAutocast() {
    if (cuda_.enabled) cuda_.apply();
    if (cpu_) compat::set_cpu_autocast(true);
  }
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  AutocastState cuda_;
  bool cpu_;
};

// The autocast a run uses: `half` (kHalf or kBFloat16, from model.mixed_precision) on CUDA;
// none on CPU or for kFloat (fp32).
inline AutocastState autocast_for(const torch::Device& device, at::ScalarType half) {
  AutocastState s;
  if (!device.is_cuda() || half == at::kFloat) return s;
  s.enabled = true;
  s.dtype = half;
  return s;
}

}  // namespace sana::model
