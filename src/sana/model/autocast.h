// Mixed precision on CUDA (model.mixed_precision bf16 / fp16): LibTorch's autocast, whose
// C++ API changed in 2.4 (device-generic calls; sana/torch_compat.h has both). CPU runs stay in
// fp32 (the linear attention is fp32 anyway with model.fp32_attention); tests run CUDA's casts
// on the CPU under the CPU's autocast, which the state carries too. The state can be
// captured and re-entered, so a checkpointed block recomputes under the same autocast in
// the backward pass (which runs on autograd's thread, outside the caller's guard).
#pragma once

#include <torch/torch.h>

#include "sana/torch_compat.h"

#include <string>

namespace sana::model {

// CUDA's autocast (the one training uses) and the CPU's (which tests use to run CUDA's
// casts on the CPU), as the calling thread has them.
struct AutocastState {
  bool enabled = false;  // CUDA's
  at::ScalarType dtype = at::kBFloat16;
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;

  static AutocastState current() {
    return {compat::cuda_autocast_enabled(), compat::cuda_autocast_dtype(), compat::cpu_autocast_enabled(),
            compat::cpu_autocast_dtype()};
  }
  void apply() const {
    compat::set_cuda_autocast(enabled, dtype);
    compat::set_cpu_autocast_dtype(cpu_dtype);
    compat::set_cpu_autocast(cpu_enabled);
  }
};

// Enters `state` for its lifetime (restoring the previous one after, and dropping
// autocast's cast cache when leaving an enabled region, as torch.autocast does).
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastState& state) : previous_(AutocastState::current()) {
    state.apply();
    entered_ = state.enabled || state.cpu_enabled;
  }
  ~AutocastGuard() {
    previous_.apply();
    if (entered_ && !previous_.enabled && !previous_.cpu_enabled) at::autocast::clear_cache();
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
  NoAutocast() : previous_(AutocastState::current()) {
    if (previous_.enabled) compat::set_cuda_autocast(false, previous_.dtype);
    if (previous_.cpu_enabled) compat::set_cpu_autocast(false);
  }
  ~NoAutocast() {
    if (previous_.enabled || previous_.cpu_enabled) previous_.apply();
  }
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  AutocastState previous_;
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
