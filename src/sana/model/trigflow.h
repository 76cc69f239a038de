// SANA-Sprint's TrigFlow parameterisation of a flow model (upstream's SanaMSCM.forward, in
// diffusion/model/nets/sana_multi_scale.py; docs/upstream.md "SANA-Sprint"). A TrigFlow time
// s in [0, pi/2] and an input x_hat = x_s / sigma_d map to the flow model's time and input,
//   t = sin s / (sin s + cos s),  x_f = x_hat sqrt(t^2 + (1 - t)^2),
// the model gives the flow velocity v at (x_f, 1000 t), and the TrigFlow output is
//   F = ((1 - 2t) x_f + (1 - 2t + 2t^2) v) / sqrt(t^2 + (1 - t)^2).
// (The model divides 1000 t by scheduler.timestep_norm_scale_factor, 1000 in Sprint's YAMLs.)
#pragma once

#include <torch/torch.h>

#include "sana/model/sana_ms.h"

namespace sana::model {

// x_hat: [B, C, H, W]; s: [B] TrigFlow times. With ModelSpec::logvar and `logvar` given,
// *logvar gets the model's log-variance, [B, 1].
torch::Tensor trigflow_forward(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                               const Condition& cond, torch::Tensor* logvar = nullptr);

// The outputs of blocks `ids` (ascending; SanaMSImpl::block_outputs) of the TrigFlow
// forward at (x_hat, s): what the discriminator heads read (upstream's SanaMSCMDiscriminator
// hooks its teacher's blocks while the teacher runs SanaMSCM.forward).
std::vector<torch::Tensor> trigflow_block_outputs(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                                                  const Condition& cond, const std::vector<int64_t>& ids);

struct TrigflowJvp {
  torch::Tensor out;      // F(x_hat, s)
  torch::Tensor tangent;  // dF = the derivative of F along (dx_hat, ds)
  torch::Tensor logvar;   // [B, 1] with ModelSpec::logvar, else undefined
};

// F and its exact directional derivative along (dx_hat [like x_hat], ds [B]) in one forward
// pass with ATen's forward-mode AD (dual tensors), as upstream's torch.func.jvp of the
// student: no reverse-mode graph is recorded (so gradient checkpointing is off), and the
// attention and GLU kernels run composed (model/block_kernels.h's ComposedKernels). The
// condition carries no tangent.
TrigflowJvp trigflow_jvp(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                         const Condition& cond, const torch::Tensor& dx_hat, const torch::Tensor& ds);

}  // namespace sana::model
