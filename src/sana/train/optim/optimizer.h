// Optimizers as upstream configures them: AdamW (torch's), AdamW8bit, and CAME
// (confidence-guided adaptive memory efficient optimisation: factored second moments for
// 2-D weights and 1x1 convolutions, upstream's default for Sana) and CAME8bit; and Lion
// (lion.h), Adafactor (adafactor.h), Prodigy (prodigy.h) and ScheduleFreeAdamW (schedule_free.h). The learning rate comes from
// train/optim/lr_curve.h.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sana/parallel/reducer.h"
#include "sana/util/stateful.h"

namespace sana::train {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// Numbers per parameter (the rows of an [own parameters, k] fp64 host tensor, in the
// optimizer's parameter order) summed over every trainable parameter of the model, whoever
// holds it, in one order whatever the world size: [k] (parallel::Zero::sum_over_parameters).
using SumOverParameters = std::function<torch::Tensor(const torch::Tensor&)>;

// A stateful part ("optimizer"): checkpoints hold state() as optimizer.safetensors.
class Optimizer : public Stateful {
 public:
  virtual ~Optimizer() = default;
  // The update at rate `lr` from each parameter's .grad (apply()), then what was set to
  // follow every update (after_step).
  void step(double lr) {
    apply(lr);
    if (after_step_) after_step_();
  }
  // What follows every update, set by a wrapper from outside the loop (ZeRO at stages 1
  // and 2: parallel::Zero::after_update, each owner's updated parameters to every rank).
  void after_step(std::function<void()> f) { after_step_ = std::move(f); }
  virtual const char* name() const = 0;
  // Every state tensor as "<parameter name>/<state name>" (for checkpoints); "step" is a
  // one-element int64 tensor. Parameters that never stepped have no entries.
  virtual NamedParams state() const = 0;
  // Restores state() output; throws std::invalid_argument naming a missing or mis-shaped
  // entry.
  virtual void load_state(const NamedParams& state) = 0;
  // The parameters and gradients also as flat buckets (Reducer::flatten_parameters(),
  // indices into this optimizer's params): an optimizer that can updates a bucket at a
  // time. The maths and the state() layout stay the same.
  virtual void use_flat_buckets(std::vector<parallel::FlatBucket> /*buckets*/) {}
  // The parameters were set from outside (a resume, model.load_from): an optimizer keeping
  // its own copy of them (train.offload_optimizer's masters) takes them again.
  virtual void weights_changed() {}
  // An optimizer whose step needs sums over the whole model (Prodigy's step size) takes
  // them from `sum`; without one it sums its own parameters.
  virtual void sum_parameters_with(SumOverParameters /*sum*/) {}
  // The weights to evaluate and export where they are not the parameters themselves
  // (schedule-free's x): per parameter of this optimizer that differs, by name, new
  // tensors; empty for every other optimizer.
  virtual NamedParams eval_weights() const { return {}; }
  // Whether eval_weights() is this kind's (the same on every rank).
  virtual bool has_eval_weights() const { return false; }
  // train.offload_optimizer (host_optimizer.h): the state lives in host memory, with the
  // master weights and their gradient buffers.
  virtual bool on_host() const { return false; }
  virtual std::vector<torch::Tensor> host_weights() const { return {}; }
  virtual std::vector<torch::Tensor> host_gradients() const { return {}; }

  // ckpt.save_optimizer false: checkpoints hold an empty optimizer.safetensors, and a
  // resume from one restarts the moments (said once).
  void keep_in_checkpoints(bool keep) { checkpointed_ = keep; }
  std::string state_name() const override { return "optimizer"; }
  PartState save_state() const override;
  void restore_state(const PartState* saved, const std::string& source) override;

 protected:
  virtual void apply(double lr) = 0;  // step()'s update

 private:
  bool checkpointed_ = true;
  std::function<void()> after_step_;
};

// train.optimizer, by its keys' names (train/options/torch_options.h fills it from the config, whose
// loader has filled in each optimizer's own defaults).
struct OptimizerOptions {
  enum class Kind { AdamW, CAME, CAME8bit, AdamW8bit, Lion, Adafactor, Prodigy, ScheduleFreeAdamW };
  Kind type = Kind::AdamW;
  std::vector<double> betas{0.9, 0.999};  // AdamW: 2; CAME: 3; Adafactor: 0 or 1; Prodigy: 2 or 3
  std::vector<double> eps{1e-8};          // AdamW: 1; CAME, Adafactor: 2; Lion: none
  double weight_decay = 0.0;
  int64_t block_size = 2048;      // CAME8bit: rows per quantisation block
  int64_t min_8bit_size = 16384;  // the 8-bit kinds: smaller parameters keep fp32 moments
  // Adafactor's (adafactor.h)
  double clip_threshold = 1.0, decay_rate = -0.8;
  bool scale_parameter = true, relative_step = true, warmup_init = false;
  // Prodigy's (prodigy.h)
  double d0 = 1e-6, d_coef = 1.0, growth_rate = std::numeric_limits<double>::infinity();
  bool decouple = true, use_bias_correction = false, safeguard_warmup = false;
  int64_t slice_p = 1;
  // ScheduleFreeAdamW's (schedule_free.h)
  int64_t warmup_steps = 0;
  double r = 0.0, weight_lr_power = 2.0;
  bool came() const { return type == Kind::CAME || type == Kind::CAME8bit; }
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o, const NamedParams& params);
// The kind's name as train.optimizer.type spells it ("CAME8bit").
const char* optimizer_name(OptimizerOptions::Kind kind);

// Per-parameter state tensors by name, shared by the optimizers below.
class StatefulOptimizer : public Optimizer {
 public:
  explicit StatefulOptimizer(NamedParams params) : params_(std::move(params)), state_(params_.size()) {}
  NamedParams state() const override;
  void load_state(const NamedParams& state) override;

 protected:
  struct State {
    int64_t step = 0;
    std::map<std::string, torch::Tensor> tensors;  // references stay valid as it grows
    torch::Tensor& get(const std::string& name) { return tensors[name]; }
  };
  // Numbers an optimizer keeps for all its parameters at once (Prodigy's step size, a step
  // count): state() plus each of `globals` as "<parameter>/<name>" of every stepped
  // parameter, so that whichever rank resumes a parameter has them.
  NamedParams state_with(const NamedParams& globals) const;
  // load_state() of `saved` without the globals named `names`, which it returns (empty
  // when nothing stepped); throws std::invalid_argument when some are missing.
  std::map<std::string, torch::Tensor> load_state_with(const NamedParams& saved, const std::vector<std::string>& names);
  NamedParams params_;
  std::vector<State> state_;
};

// AdamW as torch.optim.AdamW computes it (decoupled weight decay, bias correction). Given
// flat buckets covering every parameter, its moments live in flat tensors too (each
// parameter's state() entries are views of them) and a step is five operations per bucket
// instead of per parameter; on CUDA one: ATen's fused AdamW kernel (torch.optim.AdamW's
// fused=True) over every bucket, reading each gradient and moment once.
class AdamW : public StatefulOptimizer {
 public:
  // Where the flat step runs as ATen's fused kernel: on CUDA, or on every device (its CPU
  // kernel too: for tests).
  enum class Fused { on_cuda, always };
  AdamW(NamedParams params, std::vector<double> betas, double eps, double weight_decay, Fused fused = Fused::on_cuda);
  void apply(double lr) override;
  const char* name() const override { return "AdamW"; }
  void load_state(const NamedParams& state) override;
  void use_flat_buckets(std::vector<parallel::FlatBucket> buckets) override;

 private:
  // Flat moments for every bucket, the per-parameter state made views of them; false when
  // the buckets do not cover every parameter or the parameters' step counts differ.
  bool prepare_flat();
  void flat_step(double lr);
  double beta1_, beta2_, eps_, weight_decay_;
  Fused fused_;
  std::vector<parallel::FlatBucket> buckets_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;  // per bucket, when prepared
  std::vector<torch::Tensor> steps_;                 // the fused kernel's step count per bucket (float, on the device)
  bool flat_ready_ = false;
};

// Upstream's 8-bit first moments (CAME8BitWrapper): for a 2-D weight or 1x1 convolution
// with more than `min_size` elements, the first moment lives as uint8 codes in chunks of
// `block_rows` rows, each chunk with its fp32 min and scale (max - min) / 255.
struct EightBitState {
  bool on = false;
  int64_t block_rows = 2048;
  int64_t min_size = 16384;
  bool applies(at::IntArrayRef shape) const;
  // train.optimizer's: on for CAME8bit, with its block_size and min_8bit_size.
  static EightBitState of(const OptimizerOptions& o) {
    return {o.type == OptimizerOptions::Kind::CAME8bit, o.block_size, o.min_8bit_size};
  }
};

// CAME as upstream's CAMEWrapper computes it, operation for operation; with `eight_bit`
// upstream's CAME8BitWrapper (the moment dequantized at the start of a step and quantized
// again right after its update; the rest of the step uses the fp32 value). Checkpoints hold
// 8-bit moments as "<param>/exp_avg.codes" (uint8), ".scale" and ".min"; a checkpoint of the
// other kind is converted on load. Exposed for its tests.
class Came : public StatefulOptimizer {
 public:
  Came(NamedParams params, std::vector<double> betas, std::vector<double> eps, double weight_decay,
       double clip_threshold = 1.0, EightBitState eight_bit = {});
  void apply(double lr) override;
  const char* name() const override { return eight_bit_.on ? "CAME8bit" : "CAME"; }
  // Whether a parameter of this shape keeps factored (row, column) statistics.
  static bool factored(at::IntArrayRef shape);

 private:
  // The first moment of parameter state `s` in fp32 (dequantized, converted or new).
  torch::Tensor first_moment(State& s, const torch::Tensor& like, bool quantized) const;
  // Keeps `m` as the state's first moment: quantized or as is.
  void keep_first_moment(State& s, const torch::Tensor& m, bool quantized) const;
  // The step's parts, each over a group of parameters at once (optimizer.cpp).
  struct Group;
  void collect(Group& factored, Group& plain);
  std::vector<torch::Tensor> states(const Group& g, const char* name);
  std::vector<torch::Tensor> running_means(const Group& g, const std::vector<torch::Tensor>& v, const char* row,
                                           const char* col, double beta);
  void update_moments(Group& g);
  std::vector<torch::Tensor> directions(Group& g, double lr);
  double beta1_, beta2_, beta3_, eps1_, eps2_, weight_decay_, clip_;
  EightBitState eight_bit_;
};

}  // namespace sana::train
