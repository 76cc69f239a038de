// One optimizer step's work on this rank: its share of the global batch, in micro-batches of
// at most train.micro_batch_size (shares differ by at most one sample across ranks), through
// the flow-matching objective, forward and backward, with the reducer syncing gradients
// during the last backward. Owns the per-step mechanics (device copies, encoders, the
// condition, autocast); decisions about the step belong to the trainer.
#pragma once

#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sana/data/loader.h"
#include "sana/diffusion/flow_matching.h"
#include "sana/diffusion/options.h"
#include "sana/parallel/reducer.h"
#include "sana/model/autocast.h"
#include "sana/model/sana_ms.h"
#include "sana/train/input/data_guards.h"
#include "sana/train/step/device_feed.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/step/step_times.h"

namespace sana::train {

struct StepOutput {
  // float64 on the device: this rank's part of the step's loss (its samples' losses / the global batch)
  torch::Tensor loss_sum;
  int64_t samples = 0;            // the step's global batch
  int64_t height = 0, width = 0;  // pixels
  int64_t largest_micro_batch = 0;  // samples in this rank's largest micro-batch
  StepTimes times;                // data, encoders, forward_backward and allreduce filled
};

// What a training step needs to know of the run (train/options/torch_options.h fills it).
struct StepOptions {
  std::string work_dir;                  // tests' id logs and batch dumps go there
  at::ScalarType half = at::kFloat;      // model.mixed_precision: the autocast type (kFloat: none)
  int64_t micro_batch_size = 1;          // train.micro_batch_size
  bool deterministic = false;            // train.deterministic: the loader's batches are kept in order
  bool precomputed_latents = false;      // data.load_vae_feat: the batches carry latents, not images
  double class_dropout_prob = 0.0;       // model.class_dropout_prob
  uint64_t seed = 0;                     // train.seed: timesteps, noise and dropout draws
  diffusion::TimestepOptions timesteps;  // the scheduler's timestep sampling
  double unmasked_weight = 0.1;          // train.masked_loss_unmasked_weight (batches with masks)
  // data.class_data_dir (batches with prior_images): the class images train beside the
  // samples, captioned class_prompt; loss = the samples' + prior_loss_weight x theirs.
  std::string class_prompt;
  double prior_loss_weight = 1.0;
  int rank = 0, world_size = 1;
  // Every forward is collective (parallel::Zero::forwards_collective): each rank runs as
  // many micro-batches as the rank with the most.
  bool forwards_collective = false;
  // Tests only (TestHooks::log_ids, dump_batches): each micro-batch's sample ids to
  // work_dir/ids.rank<R>.w<W>.log; its model input, target and weights to work_dir/batches/.
  bool log_ids = false, dump_batches = false;
};

class TrainStep {
 public:
  TrainStep(StepOptions options, model::SanaMS& model, const Encoders& encoders, parallel::Reducer& reducer);

  bool pinned() const { return feed_.pinned(); }
  // Forward and backward of this rank's micro-batches of step `step` of `epoch`; every
  // batch is counted by `guard`. After it the gradients are synced on every rank.
  // `loss_scale` multiplies each loss before its backward (fp16 loss scaling; 1 otherwise).
  StepOutput run(data::Loader& loader, int64_t epoch, int64_t step, BadSampleGuard& guard, double loss_scale = 1.0);

  // A micro-batch as the model takes it: x0 (latents, or pixels), its condition (drop not
  // set) and its samples' ids.
  struct Prepared {
    torch::Tensor x0;
    model::Condition cond;
    std::vector<data::SampleId> ids;
  };
  // This rank's micro-batches of step `step` of `epoch`, read, counted by `guard`, on the
  // device and through the encoders, but run through nothing: for an objective that needs
  // the rank's whole share before its first backward (SANA-Sprint's stage 2,
  // sprint/sprint_step.h). Fills out's samples, size and data/encoder times.
  std::vector<Prepared> prepare(data::Loader& loader, int64_t epoch, int64_t step, BadSampleGuard& guard,
                                StepOutput& out);
  const model::AutocastState& autocast() const { return amp_; }

  // train.eval: the loss of `batch`'s one sample at each of `timesteps`, in order (one
  // forward of a row per timestep, no gradients; train/previews/eval_loss.h): each the mean squared
  // error over its elements, weighted by its mask's cells under train.masked_loss.
  std::vector<double> eval_losses(const data::Batch& batch, const std::vector<int64_t>& timesteps);

 private:
  // Micro-batch `micro` of step `step` from the loader, checked to be that one and counted
  // (guard, out's sizes, the tests' id log).
  data::Batch next_batch(data::Loader& loader, int64_t epoch, int64_t step, int64_t micro, BadSampleGuard& guard,
                         StepOutput& out);
  // One micro-batch forward and backward (`last`: the step's last on this rank), its loss
  // added to out.loss_sum and its times to out.times.
  // `padding`: a micro-batch run only so that this rank runs as many forwards as the rank
  // with the most (ZeRO stage 3 gathers parameters in every forward): its loss weighs 0.
  void forward_backward(const data::Batch& batch, int64_t epoch, bool last, double loss_scale, StepOutput& out,
                        bool padding = false);
  // Micro-batches this rank runs in a step whose batch is `batch`: its own, or where every
  // forward is collective (parallel::Zero::forwards_collective) the most any rank has.
  int64_t runs_for(const data::Batch& batch) const;
  // The micro-batch's mean loss times `weight` (its share of the global batch); the time in
  // the encoders goes to times.encoders, out of `compute` (forward_backward's phase).
  torch::Tensor micro_loss(const data::Batch& batch, int64_t epoch, double weight, PhaseTimer& compute,
                           StepTimes& times);
  // What the model gets of a micro-batch before the flow maths: x0 (latents, or pixels),
  // the control latent, the condition (drop and control not set), the cell weights of its
  // masks (train.masked_loss). The encoders' time goes to times.encoders, out of `compute`.
  // With class images (data.class_data_dir) their rows follow the samples' in every tensor.
  struct Inputs {
    torch::Tensor x0, control, loss_weights;
    model::Condition cond;
    int64_t prior_rows = 0;
  };
  Inputs inputs(const data::Batch& batch, PhaseTimer& compute, StepTimes& times);
  // Tests only (TestHooks::dump_batches): the micro-batch as the model gets it, to dump_dir_.
  void dump(const diffusion::FlowBatch& fb, const Inputs& in, double weight);
  // The micro-batch's loss: the flow loss over its samples' rows (cell-weighted under
  // train.masked_loss), plus prior_loss_weight x that of its class images' rows.
  torch::Tensor loss_of(const torch::Tensor& prediction, const torch::Tensor& target, const Inputs& in) const;
  // Waits for the gradients' all-reduce (times.allreduce).
  void finalize(StepTimes& times);
  model::Condition condition(const data::Batch& batch, const std::vector<torch::Tensor>& on_device);

  StepOptions o_;
  model::SanaMS& model_;
  Encoders encoders_;
  parallel::Reducer& reducer_;
  DeviceFeed feed_;
  model::AutocastState amp_;
  std::unique_ptr<std::ofstream> ids_log_;  // tests only (TestHooks::log_ids)
  // Tests only (TestHooks::dump_batches): where each micro-batch goes, this rank, how many
  // it wrote, and the epoch and step they belong to.
  std::string dump_dir_;
  int64_t dumped_ = 0;
  int64_t dump_epoch_ = 0, dump_step_ = 0;
};

// The squared global gradient norm of `grads` (each gradient element in exactly one of them:
// the reducer's flat buckets) and this rank's loss, as a float64 tensor {square, loss} on
// their device, nothing read: each bucket's norm accumulated in float64 from its float32
// elements, the buckets' squares summed in float64 in the given order. The step agreement
// carries both to the host (loop/step_agreement.h).
torch::Tensor grad_square_and_loss(const std::vector<torch::Tensor>& grads, const torch::Tensor& loss_sum);

// Gradients (`grads`, the reducer's flat buckets) computed from a loss scaled by `loss_scale`, whose true global norm is
// `grad_norm`: divided by the scale and, when gradient_clip > 0 and the norm exceeds it,
// clipped as torch's clip_grad_norm_ (factor clip / (norm + 1e-6)), in one multiplication.
void unscale_and_clip(const std::vector<torch::Tensor>& grads, double grad_norm, double loss_scale, double clip);

// Whether a run scales its loss: autocast to fp16 (CUDA with model.mixed_precision fp16).
// `half`: the half type model.mixed_precision names (train/options/torch_options.h's half_type).
bool loss_scaling(const torch::Device& device, at::ScalarType half);
// The dtype the forward computes in: the autocast dtype on CUDA, else kFloat (ZeRO stage 3
// gathers parameters in it).
at::ScalarType compute_type(const torch::Device& device, at::ScalarType half);

}  // namespace sana::train
