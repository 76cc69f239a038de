// SanaMS, the multi-scale linear diffusion transformer, in LibTorch: patch embedding
// without positional embedding (any bucket whose sides divide by the patch runs through
// one model), AdaLN-single timestep conditioning, ReLU linear self-attention (LiteLA),
// softmax cross-attention to caption tokens or a class token, the GLUMBConv Mix-FFN, and
// a final layer with its own modulation table. Parameter names follow upstream's module
// paths (x_embedder.proj.weight, blocks.3.attn.qkv.weight, ...), so upstream state dicts
// map one to one. The layers are our own small modules so that a model can be built on
// the meta device (shapes and counts without memory) and its FLOPs traced.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sana/model/spec.h"
#include "sana/model/working_weights.h"

namespace sana::model {

// Adds 2 x multiply-adds of every matrix product and convolution run on this thread while
// it lives (the tests hold the analytic count in forward_flops() against it).
class FlopTrace {
 public:
  FlopTrace();
  ~FlopTrace();
  FlopTrace(const FlopTrace&) = delete;
  FlopTrace& operator=(const FlopTrace&) = delete;
  double flops() const { return flops_; }
  static void add(double flops);
  static bool active();  // a trace lives on this thread

 private:
  double flops_ = 0;
  FlopTrace* outer_;
};

// x [..., in] times weight [out, in]^T, + bias (undefined: none): every Linear's product,
// on the CPU's threads as layers.cpp says.
torch::Tensor token_product(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// While one lives on this thread, token_product() is torch::linear on any number of threads:
// the product a GPU runs, whose saved tensors the memory estimate measures on the CPU (the
// threaded CPU path's convolution keeps other copies, so the estimate grew with the threads:
// 5.78 GiB at one thread, 6.23 at two for the README's 1.6B LoRA row, 2026-12-06).
class DeviceProducts {
 public:
  DeviceProducts();
  ~DeviceProducts();
  DeviceProducts(const DeviceProducts&) = delete;
  DeviceProducts& operator=(const DeviceProducts&) = delete;

 private:
  bool outer_;
};

// The layers a model's modules call through typed members (Linear, Conv2d) can be wrapped
// from outside: code that adapts a layer (model/lora.h) builds a module of a derived type
// around it, sharing its parameters under the same names, and replace_layer() puts it in
// the layer's place, in the member and in the module tree alike. forward() and
// forward_tokens() are virtual for that; a plain layer adds nothing of its own.
class LayerHost : public torch::nn::Module {
 public:
  LayerHost() = default;
  LayerHost(const LayerHost&) = delete;  // the replacers hold this object's members
  LayerHost& operator=(const LayerHost&) = delete;
  // Puts `replacement` in the place of child `name`, a layer registered with layer(); it
  // must be of that layer's type or derived from it. Throws std::logic_error otherwise.
  void replace_layer(const std::string& name, std::shared_ptr<torch::nn::Module> replacement);

 protected:
  // register_module() for a layer that may be replaced, into `member`, the typed member
  // the module calls it through.
  template <class Impl>
  void layer(const std::string& name, torch::nn::ModuleHolder<Impl>& member, torch::nn::ModuleHolder<Impl> value) {
    member = register_module(name, std::move(value));
    replacers_[name] = [this, &member, name](std::shared_ptr<torch::nn::Module> m) {
      auto typed = std::dynamic_pointer_cast<Impl>(m);
      if (!typed) return false;
      member = torch::nn::ModuleHolder<Impl>(typed);
      replace_module(name, m);
      return true;
    };
  }

 private:
  std::map<std::string, std::function<bool(std::shared_ptr<torch::nn::Module>)>> replacers_;
};

// The layer at `path` (blocks.3.attn.qkv) of `root`, replaced as LayerHost::replace_layer
// does; returns the layer it replaced.
std::shared_ptr<torch::nn::Module> replace_layer(torch::nn::Module& root, const std::string& path,
                                                 std::shared_ptr<torch::nn::Module> replacement);

class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, const torch::TensorOptions& options);
  virtual torch::Tensor forward(const torch::Tensor& x);
  // Tensors a backward through the layer differentiates besides its parameters (a wrapper's
  // own, which gradient checkpointing recomputes with); none for a plain layer.
  virtual std::vector<torch::Tensor> extra_inputs() const { return {}; }
  // The dtype the layer computes in: its weight's, unless the weight is stored in less
  // (model/frozen_storage.h).
  virtual torch::ScalarType compute_dtype() const { return weight.scalar_type(); }
  // [out, in]: the weight's shape, unless it is stored otherwise (NF4 packs it flat).
  virtual std::vector<int64_t> weight_shape() const { return weight.sizes().vec(); }
  // The weight as the product takes it: its half working copy where it has one.
  torch::Tensor product_weight() const { return working ? working->of(weight) : weight; }
  torch::Tensor weight, bias;
  std::shared_ptr<WorkingCopy> working;  // train.working_weights (model/working_weights.h)

 protected:
  // For a wrapper of `base`: every parameter `base` registers, under the same names.
  explicit LinearImpl(const LinearImpl& base);
  // For a layer that keeps its weight otherwise (model/frozen_storage.h): these tensors as
  // its "weight" and "bias" (undefined: none).
  LinearImpl(const torch::Tensor& weight, const torch::Tensor& bias);
};
TORCH_MODULE(Linear);

class Conv2dImpl : public torch::nn::Module {
 public:
  Conv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
             int64_t groups, bool bias, const torch::TensorOptions& options);
  virtual torch::Tensor forward(const torch::Tensor& x);
  // A 1x1 convolution (stride 1, no padding or groups) of tokens x = [B, h*w, in]: the same
  // product as forward() on the [B, in, h, w] image, as a Linear, without laying it out.
  virtual torch::Tensor forward_tokens(const torch::Tensor& x, int64_t h, int64_t w);
  virtual std::vector<torch::Tensor> extra_inputs() const { return {}; }  // as LinearImpl's
  virtual torch::ScalarType compute_dtype() const { return weight.scalar_type(); }  // as LinearImpl's
  virtual std::vector<int64_t> weight_shape() const { return weight.sizes().vec(); }  // as LinearImpl's
  torch::Tensor product_weight() const { return working ? working->of(weight) : weight; }  // as LinearImpl's
  torch::Tensor weight, bias;
  int64_t stride, padding, groups;
  std::shared_ptr<WorkingCopy> working;

 protected:
  explicit Conv2dImpl(const Conv2dImpl& base);  // for a wrapper of `base`, as LinearImpl's
  Conv2dImpl(const torch::Tensor& weight, const torch::Tensor& bias, int64_t stride, int64_t padding,
             int64_t groups);  // as LinearImpl's
};
TORCH_MODULE(Conv2d);

// x * rsqrt(mean(x^2) + eps) times a weight initialised to `scale`, computed in fp32 and
// cast back to x's type (upstream's (weight * norm(x.float())).type_as(x)).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double scale, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Linear self-attention with a ReLU kernel: per head, out = (v_pad k^T) q with v padded by
// a row of ones, divided by that row (+ eps); in fp32 when fp32_attention. The core is
// model/block_kernels.h's linear_attention, on the qkv product's own token-major layout.
class LiteLAImpl : public LayerHost {
 public:
  LiteLAImpl(const ModelSpec& spec, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  // The attention core alone: q, k, v are [B, heads, head_dim, N]; returns [B, heads, head_dim, N].
  static torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double eps, bool fp32);
  Linear qkv{nullptr}, proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  int64_t heads, head_dim;
  bool fp32;
  bool fused_kernels = false;  // as SanaMSBlockImpl's
  static constexpr double kEps = 1e-8;
};
TORCH_MODULE(LiteLA);

// Softmax attention of image tokens to conditioning tokens; `bias` is [B, 1, 1, L]
// (0 for real tokens, -10000 for padding) or undefined.
class CrossAttentionImpl : public LayerHost {
 public:
  CrossAttentionImpl(int64_t hidden, int64_t heads, bool cross_norm, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& bias);
  Linear q_linear{nullptr}, kv_linear{nullptr}, proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // model.cross_norm
  int64_t heads;
};
TORCH_MODULE(CrossAttention);

// upstream's ConvLayer: a Conv2d under the name "conv".
class ConvLayerImpl : public LayerHost {
 public:
  ConvLayerImpl(int64_t in, int64_t out, int64_t kernel, int64_t groups, bool bias,
                const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x) { return conv->forward(x); }
  Conv2d conv{nullptr};
};
TORCH_MODULE(ConvLayer);

// 1x1 conv C -> 2H (+bias, SiLU), depthwise 3x3 on 2H (+bias), a * SiLU(g), 1x1 H -> C;
// upstream's parameters, computed on the tokens' layout (sana_ms.cpp says how).
class GLUMBConvImpl : public torch::nn::Module {
 public:
  GLUMBConvImpl(int64_t hidden, int64_t mlp_hidden, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x, int64_t h, int64_t w);  // x: [B, h*w, C]
  ConvLayer inverted_conv{nullptr}, depth_conv{nullptr}, point_conv{nullptr};
  bool fused_kernels = false;  // as SanaMSBlockImpl's
};
TORCH_MODULE(GLUMBConv);

class SanaMSBlockImpl : public torch::nn::Module {
 public:
  SanaMSBlockImpl(const ModelSpec& spec, const torch::TensorOptions& options);
  // x: [B, N, C]; y: [B, L, C] or undefined; t0: [B, 6C]; bias as CrossAttention.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& t0,
                        const torch::Tensor& bias, int64_t h, int64_t w);
  LiteLA attn{nullptr};
  CrossAttention cross_attn{nullptr};
  GLUMBConv mlp{nullptr};
  torch::Tensor scale_shift_table;  // [6, C]
  bool fused_kernels = false;  // model.kernels: fused (SanaMSImpl::set_fused_kernels)
  // What a backward through the block differentiates besides its inputs: its parameters,
  // then its layers' extra inputs (a wrapper's; gradient checkpointing recomputes with them).
  std::vector<torch::Tensor> differentiable() const;
};
TORCH_MODULE(SanaMSBlock);

// What the model is conditioned on, per sample.
struct Condition {
  torch::Tensor y;     // caption: [B, L, caption_channels] features; class: [B] int64 labels
  torch::Tensor mask;  // caption: [B, L], nonzero for real tokens (optional)
  torch::Tensor drop;  // [B] bool: use the null caption / null class (optional)
  // ControlNet models: the control latent, [B, in_channels, H, W] like x (undefined: the
  // base model alone), and the weight of the control blocks' outputs (1 as trained).
  torch::Tensor control;
  double control_scale = 1.0;
  // ModelSpec::cfg_embed: each sample's guidance scale, [B] (required then).
  torch::Tensor cfg_scale;
};

struct BuildOptions {
  torch::Dtype dtype = torch::kFloat32;
  bool meta = false;   // shapes only: no memory, no initialisation
  uint64_t seed = 0;   // initial weights are a pure function of the seed
};

// Top-level pieces, each named as upstream names it.
class PatchEmbedImpl : public LayerHost {  // x_embedder
 public:
  PatchEmbedImpl(const ModelSpec& spec, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);  // [B, Cin, H, W] -> [B, N, C]
  Conv2d proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

// Upstream's nn.Sequential(Linear, SiLU, Linear) as t_embedder.mlp (parameters 0.*, 2.*)
// and nn.Sequential(SiLU, Linear) as t_block (1.*), with the layers as typed members.
class TimestepMlpImpl : public LayerHost {
 public:
  TimestepMlpImpl(int64_t in, int64_t hidden, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x) { return second->forward(torch::silu(first->forward(x))); }
  Linear first{nullptr}, second{nullptr};  // "0", "2"
};
TORCH_MODULE(TimestepMlp);

class TimeBlockImpl : public LayerHost {
 public:
  TimeBlockImpl(int64_t hidden, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& t) { return linear->forward(torch::silu(t)); }
  Linear linear{nullptr};  // "1"
};
TORCH_MODULE(TimeBlock);

class TimestepEmbedderImpl : public torch::nn::Module {  // t_embedder
 public:
  TimestepEmbedderImpl(int64_t hidden, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& t);  // [B] -> [B, C]
  TimestepMlp mlp{nullptr};
};
TORCH_MODULE(TimestepEmbedder);

class MlpImpl : public LayerHost {  // y_embedder.y_proj: fc1, GELU(tanh), fc2
 public:
  MlpImpl(int64_t in, int64_t hidden, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

class CaptionEmbedderImpl : public torch::nn::Module {  // y_embedder (captions)
 public:
  CaptionEmbedderImpl(const ModelSpec& spec, const torch::TensorOptions& options);
  // y: [B, L, D]; drop: [B] bool or undefined -> [B, L, C]
  torch::Tensor forward(const torch::Tensor& y, const torch::Tensor& drop);
  Mlp y_proj{nullptr};
  torch::Tensor y_embedding;  // buffer [L, D]: the null caption (as upstream: not trained)
};
TORCH_MODULE(CaptionEmbedder);

class TableImpl : public torch::nn::Module {  // a bare "weight" (embedding_table.weight)
 public:
  TableImpl(int64_t rows, int64_t cols, const torch::TensorOptions& options);
  torch::Tensor weight;
};
TORCH_MODULE(Table);

class LabelEmbedderImpl : public torch::nn::Module {  // y_embedder (class labels)
 public:
  LabelEmbedderImpl(const ModelSpec& spec, const torch::TensorOptions& options);
  // labels: [B] int64; drop: [B] bool or undefined -> [B, 1, C]; row num_classes is null
  torch::Tensor forward(const torch::Tensor& labels, const torch::Tensor& drop);
  Table embedding_table{nullptr};
  int64_t num_classes;
};
TORCH_MODULE(LabelEmbedder);

class FinalLayerImpl : public LayerHost {  // final_layer
 public:
  FinalLayerImpl(const ModelSpec& spec, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t);  // t: [B, C]
  Linear linear{nullptr};
  torch::Tensor scale_shift_table;  // [2, C]
  bool fused_kernels = false;  // as SanaMSBlockImpl's
};
TORCH_MODULE(FinalLayer);

// Upstream's ControlSanaMSBlock: a copy of base block `index` (copied_block) whose output,
// through a zero-initialised linear (after_proj), is added to the next base block's input;
// the first also takes the control latent's tokens through a zero-initialised before_proj,
// added to the base stream after block 0.
class ControlSanaMSBlockImpl : public LayerHost {
 public:
  ControlSanaMSBlockImpl(const ModelSpec& spec, int64_t index, const torch::TensorOptions& options);
  SanaMSBlock copied_block{nullptr};
  Linear before_proj{nullptr};  // the first only
  Linear after_proj{nullptr};
  int64_t index;
};
TORCH_MODULE(ControlSanaMSBlock);

// What a caller outside the model learns of a forward, as torch's module hooks tell it: the
// forward's start and end, each block's start and end, and the backward reaching each block
// (the gradient of the block's output is ready; the block's backward comes next). A
// ControlNet's control block k - 1 runs inside block k's start and end (it feeds block k).
// The model knows nothing of what the caller does with it.
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void forward_begins() = 0;
  virtual void block_forward(int64_t block, bool begins) = 0;  // before (true) and after (false) it
  virtual void backward_reaches(int64_t block) = 0;
  // After the final layer; `backward_follows`: the output takes part in a backward.
  virtual void forward_ends(bool backward_follows) = 0;
};

class SanaMSImpl : public torch::nn::Module {
 public:
  explicit SanaMSImpl(const ModelSpec& spec, const BuildOptions& options = {});

  // x: [B, in_channels, H, W] with H, W multiples of the patch; timestep: [B] (sigma * 1000).
  // Returns [B, out_channels, H, W]. With ModelSpec::logvar and `logvar` given, *logvar gets
  // the log-variance, [B, 1] (upstream's return_logvar).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& timestep,
                        const Condition& cond = {}, torch::Tensor* logvar = nullptr);
  // The outputs [B, N, C] of blocks `ids` (strictly ascending) of the forward at (x,
  // timestep, cond); the blocks after the last of them and the final layer do not run. What
  // SANA-Sprint's discriminator heads read of the teacher (upstream's forward hooks on
  // blocks[i], whose forward runs to the end for nothing).
  std::vector<torch::Tensor> block_outputs(const torch::Tensor& x, const torch::Tensor& timestep,
                                           const Condition& cond, const std::vector<int64_t>& ids);

  const ModelSpec& spec() const { return spec_; }
  // Gradient checkpointing of every `every`-th block, the first included (train.gc_step);
  // the others keep their activations.
  void set_grad_checkpointing(bool on, int64_t every = 1) {
    grad_checkpointing_ = on;
    checkpoint_every_ = std::max<int64_t>(1, every);
  }
  bool grad_checkpointing() const { return grad_checkpointing_; }
  // model.kernels: fused: every block's (ControlNet's copied blocks' too) layer norm +
  // modulate, linear attention and GLUMBConv middle, and the final layer's layer norm +
  // modulate, through model/fused_kernels.h where it applies.
  void set_fused_kernels(bool on);
  // The forward calls each added `hooks` (owned by the caller, until removed), in the order
  // added, as BlockHooks says.
  void add_block_hooks(BlockHooks* hooks);
  void remove_block_hooks(BlockHooks* hooks);
  // Parameter elements per top-level module (x_embedder, t_embedder, ..., final_layer),
  // in registration order.
  std::vector<std::pair<std::string, int64_t>> parameter_counts() const;
  int64_t parameter_count() const;

  // The conditioning tokens [B, L, C] and the attention bias [B, 1, 1, L] (or undefined).
  std::pair<torch::Tensor, torch::Tensor> embed_condition(const Condition& cond, int64_t batch);

  PatchEmbed x_embedder{nullptr};
  TimestepEmbedder t_embedder{nullptr};
  TimestepEmbedder cfg_embedder{nullptr};  // spec.cfg_embed
  TimeBlock t_block{nullptr};
  CaptionEmbedder caption_embedder{nullptr};  // registered as y_embedder (captions)
  LabelEmbedder label_embedder{nullptr};      // registered as y_embedder (classes)
  RMSNorm attention_y_norm{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  FinalLayer final_layer{nullptr};
  Linear logvar_linear{nullptr};              // spec.logvar
  torch::nn::ModuleList controlnet{nullptr};  // spec.control_blocks > 0: ControlSanaMSBlocks

  // ControlNet's start, as upstream's initialize_all_and_copy_from_base: each copied block
  // takes its base block's weights, before_proj and after_proj are zero.
  void copy_control_blocks();

 private:
  void initialize(uint64_t seed);
  // forward(), or with `capture` block_outputs(): the blocks in `capture` into *captured,
  // up to the last of them, and an undefined result.
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& timestep, const Condition& cond,
                    torch::Tensor* logvar, const std::vector<int64_t>* capture, std::vector<torch::Tensor>* captured);
  // Block `block` on x (checkpointed when `checkpoint`).
  torch::Tensor run_block(SanaMSBlockImpl* block, const torch::Tensor& x, const torch::Tensor& y,
                          const torch::Tensor& t0, const torch::Tensor& bias, int64_t h, int64_t w, bool checkpoint);
  // model.use_pe's embedding for an h x w grid, in `like`'s device and dtype, [1, h*w, C].
  torch::Tensor pos_embed(int64_t h, int64_t w, const torch::Tensor& like);
  ModelSpec spec_;
  std::map<std::pair<int64_t, int64_t>, torch::Tensor> pos_embed_cache_;
  bool grad_checkpointing_ = false;
  int64_t checkpoint_every_ = 1;
  std::vector<BlockHooks*> hooks_;
};
TORCH_MODULE(SanaMS);

// The sinusoidal timestep features upstream feeds t_embedder: [cos(t f), sin(t f)],
// f_i = exp(-ln(10000) i / half), float32 as upstream; float64 for a float64 t (a float64
// model: the references' precision).
torch::Tensor timestep_features(const torch::Tensor& t, int64_t dim = 256);

}  // namespace sana::model
