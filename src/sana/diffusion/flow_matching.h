// The flow-matching objective (as upstream Sana trains): per-sample u from the configured
// density (logit-normal, uniform or SD3's "mode"); on the integer grid (scheduler.timestep_grid,
// upstream's) t = floor(N u) and sigma is entry t of upstream's shifted table (t / N, shifted
// by scheduler.flow_shift), else sigma = shift(u); x_t = (1 - sigma) x0 + sigma eps, the model
// sees timestep sigma * 1000 (truncated to an integer on the grid), the target is eps - x0. Every draw for a sample (eps, sigma, caption dropout) is a pure function of
// (train.seed, epoch, sample id, purpose): never of rank, world size, worker or order,
// so the loss of a step is the same at any world size and a resume needs no RNG state.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "sana/diffusion/options.h"

namespace sana::diffusion {

struct SampleKey {
  uint64_t seed = 0;
  int64_t epoch = 0;
  uint64_t sample = 0;
};

// A CPU generator for one purpose of one sample (torch's Philox-free mt19937, seeded from
// a strong hash of the key): tensors drawn from it are the same in any thread or process.
at::Generator sample_generator(const SampleKey& key, std::string_view purpose);

// eps ~ N(0, 1) of `shape` (float32, CPU) for one sample.
torch::Tensor sample_noise(const SampleKey& key, at::IntArrayRef shape);

// The unshifted sigma in (0, 1) from the options' weighting scheme.
double sample_sigma(const SampleKey& key, const TimestepOptions& sched);

// sigma' = s * sigma / (1 + (s - 1) * sigma)
double shift_sigma(double sigma, double flow_shift);

// Upstream's training table (SpacedDiffusion for linear_flow): sigma(t) = shift(1 - beta_t) with
// beta = numpy.linspace(1, 1/steps, steps) in float64, exactly as numpy computes it; t in [0, steps).
double grid_sigma(int64_t t, int64_t steps, double flow_shift);

// The timestep index of u in (0, 1) on a grid of `steps`: floor(steps u), at most steps - 1.
int64_t grid_index(double u, int64_t steps);

// Whether this sample's caption (or class) is replaced by the null embedding.
bool caption_dropped(const SampleKey& key, double probability);

struct FlowBatch {
  torch::Tensor noisy;      // x_t, like x0
  torch::Tensor target;     // eps - x0
  torch::Tensor timesteps;  // [B] sigma' * 1000
  torch::Tensor sigmas;     // [B] sigma'
  torch::Tensor dropped;    // [B] bool: condition replaced by the null caption / class
};

// x0: [B, ...] (any device); ids: the batch's sample ids, in order; drop_probability:
// model.class_dropout_prob (the model's Condition::drop takes `dropped`).
FlowBatch make_flow_batch(const torch::Tensor& x0, const std::vector<uint32_t>& ids,
                          uint64_t seed, int64_t epoch, const TimestepOptions& sched,
                          double drop_probability = 0.0);

// A held-out sample at fixed timesteps (train.eval): x0 [T, ...] is the sample repeated, row
// j at timestep timesteps[j] of the training table (the integer grid's sigma, else
// shift(t / train_sampling_steps)) with noise drawn from (seed, sample, t) alone: the same
// at every evaluation and world size. No condition is dropped.
FlowBatch make_eval_batch(const torch::Tensor& x0, uint32_t id, uint64_t seed, const std::vector<int64_t>& timesteps,
                          const TimestepOptions& sched);

// Mean squared error between the prediction and the target.
torch::Tensor flow_loss(const torch::Tensor& prediction, const torch::Tensor& target);

// train.masked_loss (OneTrainer's masked training): masks [B, 1, H, W] in [0, 1] averaged
// over each cell of an h x w grid (H, W multiples of h, w), then clamped to
// [unmasked_weight, 1]: the loss weight of each cell [B, 1, h, w].
torch::Tensor cell_weights(const torch::Tensor& masks, int64_t h, int64_t w, double unmasked_weight);
// The mean over every element of weights x (prediction - target)^2, the weights broadcast
// over channels. Computed as flow_loss of both scaled by sqrt(weights): all-ones weights
// give flow_loss's value and gradients bitwise.
torch::Tensor masked_flow_loss(const torch::Tensor& prediction, const torch::Tensor& target,
                               const torch::Tensor& weights);

}  // namespace sana::diffusion
