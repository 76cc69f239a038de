// SANA-Sprint's LADD discriminator heads (upstream's diffusion/model/nets/ladd_blocks.py and
// sana_ladd.py's SanaMSCMDiscriminator; docs/upstream.md "SANA-Sprint"): one head per chosen
// teacher block, each reading that block's output tokens [B, N, C] as [B, C, N]:
//   block(k=1) -> ResidualBlock(block(k=9)) -> SpectralConv1d(C, 1, k=1): one logit per token,
// block(k) = SpectralConv1d(C, C, k, circular padding k/2) -> BatchNormLocal(C) -> LeakyReLU(0.2),
// ResidualBlock(f)(x) = (f(x) + x) / sqrt(2). Upstream's parameter names (heads.<i>.main.0.0.
// weight_orig, ...), so a checkpoint of the heads is upstream's DiscHeadModel state dict.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace sana::model {

class HeadReplicas;

// train.deterministic's rows (docs/sprint.md "Deterministic mode"): what makes each row's
// logits and gradients the same bits at any world size. Each canonical micro-batch's rows
// ("chunks") go through the convolutions and the affine steps alone, as the same micro-batch
// does on any rank; the batch norm's group sums are taken over every row of the batch,
// collected on every process, in one fixed order (their backward alike).
struct ExactRows {
  std::vector<int64_t> chunks;  // this process's rows per canonical micro-batch, in order
  torch::Tensor positions;      // [rows] int64: their places in the batch
  torch::Tensor all_groups;     // [total] int64: every row's group
  // An in-place sum over the processes of the step without a graph (null: one process). Each
  // row's values meet only zeros from the other processes: exact in any order.
  std::function<void(torch::Tensor&)> add_over_ranks;
  // Per chunk, leaves standing for the heads' parameters, so that each chunk's parameter
  // gradient is its own (null: the parameters themselves).
  const HeadReplicas* replicas = nullptr;
};

// BatchNormLocal's groups over a whole step's batch, wherever its rows are (W-invariant
// training, docs/sprint.md): this process's row i is in group group[i] of `count`; `sum`
// adds a tensor over every process of the step, with a backward that adds the gradients the
// same way (null: this process holds every row); `exact`: train.deterministic's rows.
struct BatchGroups {
  torch::Tensor group;  // [rows] int64
  int64_t count = 0;
  std::function<torch::Tensor(const torch::Tensor&)> sum;
  std::shared_ptr<const ExactRows> exact;
};

// The heads' parameters as one set of leaves per chunk (ExactRows::replicas): each shares
// its parameter's values and collects the gradient of that chunk's rows alone.
class HeadReplicas {
 public:
  HeadReplicas(torch::nn::Module& heads, size_t chunks);
  // Chunk `chunk`'s leaf for `parameter` (the parameter itself if it is not the heads').
  const torch::Tensor& of(const torch::Tensor& parameter, size_t chunk) const;
  // Chunk `chunk`'s gradients in the order of the heads' parameters() (zeros where none came).
  std::vector<torch::Tensor> gradients(size_t chunk) const;
  size_t chunks() const { return leaves_.size(); }

 private:
  std::vector<torch::Tensor> params_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_;
  std::vector<std::vector<torch::Tensor>> leaves_;  // [chunk][parameter]
};

// torch.nn.utils.spectral_norm over a Conv1d (dim 0, one power iteration, eps 1e-12): the
// weight used is weight_orig / sigma, sigma = u . (W v) with W = weight_orig as [out, in k];
// in training mode each forward first moves v = normalize(W^T u), u = normalize(W v) (the
// buffers weight_u, weight_v, updated in place); in eval mode they stay.
class SpectralConv1dImpl : public torch::nn::Module {
 public:
  // Conv1d's default initialisation and normalised N(0, 1) u and v, drawn from `gen`.
  SpectralConv1dImpl(int64_t in, int64_t out, int64_t kernel, at::Generator& gen,
                     const torch::TensorOptions& options = {});
  // [B, in, N] -> [B, out, N]; `groups` with ExactRows: chunk by chunk, with their replicas.
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups = nullptr);
  torch::Tensor weight_orig, bias, weight_u, weight_v;
  int64_t kernel;
};
TORCH_MODULE(SpectralConv1d);

// Upstream's grouping applied to a whole batch of `total` rows: G = ceil(total / virtual_bs)
// groups, row r in group floor(r G / total) (upstream's G equal groups where G divides the
// rows; upstream fails where it does not). `positions`: this process's rows' places in the
// batch.
BatchGroups batch_groups(const std::vector<int64_t>& positions, int64_t total, int64_t virtual_bs = 8);
// The same with train.deterministic's rows: `chunks`, this process's rows per canonical
// micro-batch in the order of `positions`; `add_over_ranks` and `replicas` as ExactRows'.
BatchGroups exact_batch_groups(const std::vector<int64_t>& positions, int64_t total, int64_t virtual_bs,
                               std::vector<int64_t> chunks, std::function<void(torch::Tensor&)> add_over_ranks,
                               const HeadReplicas* replicas = nullptr);

// Upstream's BatchNormLocal: the batch split into G = ceil(B / virtual_bs) equal groups (B
// must be a multiple of G, as upstream's view requires), each normalised per channel by its
// own mean and biased variance over its samples and tokens; then weight and bias. With
// `groups`, the groups are those (over a whole step's batch, across processes).
class BatchNormLocalImpl : public torch::nn::Module {
 public:
  explicit BatchNormLocalImpl(int64_t channels, const torch::TensorOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups = nullptr);  // [B, C, N]
  torch::Tensor weight, bias;
  int64_t virtual_bs = 8;
  double eps = 1e-5;
};
TORCH_MODULE(BatchNormLocal);

class DiscHeadImpl : public torch::nn::Module {
 public:
  DiscHeadImpl(int64_t channels, at::Generator& gen, const torch::TensorOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups = nullptr);  // [B, C, N] -> [B, 1, N]
};
TORCH_MODULE(DiscHead);

class LaddHeadsImpl : public torch::nn::Module {
 public:
  // Initial weights a pure function of `seed`.
  LaddHeadsImpl(int64_t channels, int64_t count, uint64_t seed, const torch::TensorOptions& options = {});
  // One [B, N, C] feature per head (the teacher's chosen blocks' outputs, in order) ->
  // [B, sum of N]: every head's logits, concatenated as upstream's forward does. `groups`:
  // BatchNormLocal's groups (null: upstream's, over these rows).
  torch::Tensor forward(const std::vector<torch::Tensor>& features, const BatchGroups* groups = nullptr);
  torch::nn::ModuleList heads{nullptr};
};
TORCH_MODULE(LaddHeads);

// The parameters of `count` heads on blocks of `channels`: 10 C^2 + 7 C + 1 each.
int64_t ladd_heads_parameters(int64_t channels, int64_t count);

// The discriminator's hinge loss, 0.5 (mean relu(1 - real) + mean relu(1 + fake)), and the
// generator's adversarial loss, -mean(fake) (upstream's train_scm_ladd.py).
torch::Tensor hinge_discriminator_loss(const torch::Tensor& real, const torch::Tensor& fake);
torch::Tensor hinge_generator_loss(const torch::Tensor& fake);

}  // namespace sana::model
