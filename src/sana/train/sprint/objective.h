// SANA-Sprint's stage 2 on this rank's share of one step (upstream's train_scm_ladd.py;
// docs/sprint.md): the student distils a frozen teacher through the sCM objective with an
// exact JVP, and an adversarial term from discriminator heads on the teacher's blocks; the
// generator (even steps) and the discriminator (odd steps) alternate. Every draw is keyed by
// (train.seed, step, sample id) (diffusion/scm.h), and the discriminator's local batch norm
// groups the step's whole batch wherever its rows are (model/ladd_heads.h's BatchGroups), so
// the step is the same at any world size and micro-batch size:
//   - the heads run once per phase over the share's teacher features (upstream calls the
//     discriminator once per phase on its batch), fed from every micro-batch;
//   - in the generator phase those features are first computed without a graph, the heads
//     give the adversarial loss's gradient of each feature, and each micro-batch then runs
//     the student and teacher again with a graph and backpropagates the sCM loss together
//     with those feature gradients (one more forward of the student and of the teacher's
//     first blocks than upstream's single pass, which cannot micro-batch).
// Gradients go to the .grad of what trains in the phase: the student's parameters, or the
// heads'.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "sana/diffusion/scm.h"
#include "sana/model/ladd_heads.h"
#include "sana/model/sana_ms.h"

namespace sana::train {

struct SprintOptions {
  diffusion::SprintDrawOptions draws;
  double sigma_data = 0.5;              // scheduler.sigma_data
  int64_t tangent_warmup_steps = 4000;  // train.tangent_warmup_steps
  double scm_lambda = 1.0;              // train.scm_lambda
  double adv_lambda = 0.5;              // train.adv_lambda
  bool misaligned_pairs = true;         // train.misaligned_pairs_D
  std::vector<int64_t> head_blocks;     // model.head_block_ids: the teacher blocks the heads read
  int64_t virtual_bs = 8;               // BatchNormLocal's group size
  uint64_t seed = 0;                    // train.seed
  // train.deterministic (docs/sprint.md "Deterministic mode"): the share's micro-batches are
  // canonical ones, and the heads treat each alone but for the batch norm's group sums,
  // which are taken over the gathered rows in one order; in the discriminator's phase each
  // micro-batch's gradient of the heads reaches them through its own before_backward.
  bool exact = false;
};

struct SprintMicroBatch {
  torch::Tensor x0;        // [b, C, H, W]: latents x sigma_data, on the device
  model::Condition cond;   // captions (y, mask); cfg_scale and drop are the step's to set
  std::vector<uint64_t> ids;
};

struct SprintShare {
  std::vector<SprintMicroBatch> micro;  // this rank's samples in the global batch's order
  int64_t first = 0;                    // the place of its first sample in the global batch
  int64_t global_batch = 0;
  int64_t step = 0;                     // the step's index from 0 (the draws' key, the warm-up)
  // Misaligned pairs: the x0 of the sample before this share's first in the global batch
  // (cyclically: the last sample's for the first rank), [1, C, H, W]. Undefined: the share
  // is the whole batch.
  torch::Tensor previous_x0;
};

// This rank's parts of the phase's losses (float64 on the device, summed over ranks they are
// the step's): generator {total, sCM, adversarial}, discriminator {total, real, fake}.
struct SprintLosses {
  torch::Tensor parts;  // [3]
};

// An in-place all-reduce (sum) over the step's ranks as a function of autograd: the forward
// adds a copy over the ranks, the backward adds the gradients over them the same way (each
// rank's loss is its part of the step's, so the sum's gradient is every rank's part's).
std::function<torch::Tensor(const torch::Tensor&)> summed_over_ranks(std::function<void(torch::Tensor&)> all_reduce);

class SprintObjective {
 public:
  // An in-place sum of a tensor over every rank of the step; null on one process.
  using AllReduce = std::function<void(torch::Tensor&)>;
  SprintObjective(SprintOptions options, model::SanaMS student, model::SanaMS teacher, model::LaddHeads heads,
             AllReduce all_reduce);

  static bool generator_phase(int64_t step) { return step % 2 == 0; }
  // Called before each backward that reaches what trains in the phase, `last` on the phase's
  // last (the reducer syncs then: parallel::Reducer::begin_backward). The generator runs one
  // per micro-batch, the discriminator one (in exact mode: one per micro-batch and call of
  // the heads, each handing that micro-batch's gradients to the heads' .grad after it).
  void before_backward(std::function<void(bool last)> hook) { before_backward_ = std::move(hook); }
  SprintLosses generator(const SprintShare& share);
  SprintLosses discriminator(const SprintShare& share);

  const SprintOptions& options() const { return o_; }

 private:
  struct Features;      // the heads' inputs of a phase, per head
  struct MicroDraws;    // a micro-batch's draws in the generator's phase
  model::BatchGroups groups(const Features& rows, int64_t total, const model::HeadReplicas* replicas = nullptr) const;
  // Exact mode: each chunk's gradients of the heads, from `replicas`, into their .grad.
  void hand_over(const model::HeadReplicas& replicas, bool last);
  MicroDraws generator_draws(const SprintMicroBatch& m, int64_t step) const;
  // The teacher's features of the student's x0 prediction, re-noised for the discriminator
  // (with the graph the grad mode gives).
  std::vector<torch::Tensor> fake_features(const SprintMicroBatch& m, const MicroDraws& d);
  // The generator's first pass: the adversarial loss of the share (this rank's part, into
  // *adv) and its gradient of every feature, per head [share rows, N, C].
  std::vector<torch::Tensor> adversarial_gradients(const SprintShare& share, const std::vector<MicroDraws>& draws,
                                                   torch::Tensor* adv);
  // The second pass on one micro-batch (`last`: the share's last): the sCM loss with the JVP,
  // backpropagated with the features' gradients `feature_grads` (its rows); returns its part
  // of the sCM loss.
  torch::Tensor generator_backward(const SprintMicroBatch& m, const MicroDraws& d, double r, int64_t global_batch,
                                   const std::vector<torch::Tensor>& feature_grads, bool last);

  SprintOptions o_;
  model::SanaMS student_, teacher_;
  model::LaddHeads heads_;
  AllReduce all_reduce_;
  std::function<torch::Tensor(const torch::Tensor&)> sum_;  // all_reduce_ with its backward
  std::function<void(bool)> before_backward_;
};

}  // namespace sana::train
