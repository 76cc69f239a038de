#include "sana/model/sana_ms.h"

#include "sana/model/autocast.h"
#include "sana/model/fused_kernels.h"
#include "sana/model/block_kernels.h"
#include "sana/model/pos_embed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <typeinfo>

namespace sana::model {

namespace {

torch::Tensor make(at::IntArrayRef shape, const torch::TensorOptions& options) {
  return torch::empty(shape, options);
}

// t2i_modulate(x, shift, scale) = x (1 + scale) + shift, in one pass over x (addcmul)
// instead of two (a product, then a sum, each writing a tensor of x's size).
torch::Tensor modulate(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
  return torch::addcmul(shift, x, 1 + scale);
}

torch::Tensor layer_norm(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6);
}

// modulate(layer_norm(x), shift, scale); with `fused` (model.kernels: fused) one CUDA kernel
// where it applies (model/fused_kernels.h).
torch::Tensor norm_modulate(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale,
                            bool fused) {
  if (fused && fused_layer_norm_modulate_applies(x, shift, scale)) {
    return fused_layer_norm_modulate(x, shift, scale, 1e-6);
  }
  return modulate(layer_norm(x), shift, scale);
}

}  // namespace

// --- Attention --------------------------------------------------------------------------

LiteLAImpl::LiteLAImpl(const ModelSpec& s, const torch::TensorOptions& o)
    : heads(s.linear_heads()), head_dim(s.linear_head_dim), fp32(s.fp32_attention) {
  layer("qkv", qkv, Linear(s.hidden, 3 * s.hidden, false, o));
  layer("proj", proj, Linear(s.hidden, s.hidden, true, o));
  if (s.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(s.hidden, 1.0, s.norm_eps, o));
    k_norm = register_module("k_norm", RMSNorm(s.hidden, 1.0, s.norm_eps, o));
  }
}

torch::Tensor LiteLAImpl::attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 double eps, bool in_fp32) {
  const auto qkv = torch::stack({q, k, v}, 1).permute({0, 4, 1, 2, 3});  // [B, N, 3, heads, head_dim]
  return linear_attention(qkv, eps, in_fp32).permute({0, 2, 3, 1});
}

torch::Tensor LiteLAImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  auto q_k_v = qkv->forward(x);  // [B, N, 3C]: q, k, v of every token
  if (q_norm) {
    const auto parts = q_k_v.reshape({B, N, 3, C}).unbind(2);
    q_k_v = torch::stack({q_norm->forward(parts[0]), k_norm->forward(parts[1]), parts[2]}, 2);
  }
  const auto qkv5 = q_k_v.reshape({B, N, 3, heads, head_dim});
  // [B, N, heads, head_dim]; model.kernels fused: one CUDA kernel each way for fp32 products.
  const auto out = fused_kernels && fp32 && fused_linear_attention_applies(qkv5) ? fused_linear_attention(qkv5, kEps)
                                                                                 : linear_attention(qkv5, kEps, fp32);
  return proj->forward(out.reshape({B, N, C}).to(x.scalar_type()));
}

CrossAttentionImpl::CrossAttentionImpl(int64_t hidden, int64_t heads_, bool cross_norm,
                                       const torch::TensorOptions& o)
    : heads(heads_) {
  layer("q_linear", q_linear, Linear(hidden, hidden, true, o));
  layer("kv_linear", kv_linear, Linear(hidden, 2 * hidden, true, o));
  layer("proj", proj, Linear(hidden, hidden, true, o));
  if (cross_norm) {  // upstream's MultiHeadCrossAttention(qk_norm=cross_norm): over all C, eps 1e-6
    q_norm = register_module("q_norm", RMSNorm(hidden, 1.0, 1e-6, o));
    k_norm = register_module("k_norm", RMSNorm(hidden, 1.0, 1e-6, o));
  }
}

torch::Tensor CrossAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& y,
                                          const torch::Tensor& bias) {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2), L = y.size(1);
  const int64_t hd = C / heads;
  auto q_full = q_linear->forward(x);
  const auto kv = kv_linear->forward(y).view({B, L, 2, C}).unbind(2);
  auto k_full = kv[0];
  if (q_norm) {
    q_full = q_norm->forward(q_full);
    k_full = k_norm->forward(k_full);
  }
  const auto q = q_full.view({B, N, heads, hd}).transpose(1, 2);
  const auto k = k_full.reshape({B, L, heads, hd}).transpose(1, 2);
  const auto v = kv[1].reshape({B, L, heads, hd}).transpose(1, 2);
  // softmax(q k^T / sqrt(hd) + bias) v as one ATen call: a fused kernel (flash or
  // memory-efficient attention on CUDA, the flash kernel on the CPU) where one takes the
  // shapes and the additive caption mask, the matrix products and the softmax otherwise.
  // The two products and the softmax themselves under forward-mode AD (SANA-Sprint's JVP:
  // ATen's fused kernels have no forward derivative) and for a single key (class-label
  // conditioning: the softmax is exactly 1, the queries' gradients exactly 0, where the fused
  // backward's recomputation leaves roundoff in them).
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const bool tangents = q._fw_grad(0).defined() || k._fw_grad(0).defined() || v._fw_grad(0).defined();
  torch::Tensor out;  // [B, h, N, hd]
  if (tangents || L == 1) {
    auto scores = torch::matmul(q, k.transpose(-1, -2)) * scale;
    if (bias.defined()) scores = scores + bias;
    out = torch::matmul(torch::softmax(scores, -1), v);
  } else {
    std::optional<at::Tensor> mask;
    if (bias.defined()) mask = bias.to(q.scalar_type());
    out = at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false, scale);
  }
  if (FlopTrace::active()) FlopTrace::add(4.0 * static_cast<double>(B * N * L * C));
  return proj->forward(out.transpose(1, 2).reshape({B, N, C}));
}

// --- Feed-forward -----------------------------------------------------------------------

ConvLayerImpl::ConvLayerImpl(int64_t in, int64_t out, int64_t kernel, int64_t groups, bool bias,
                             const torch::TensorOptions& o) {
  layer("conv", conv, Conv2d(in, out, kernel, 1, kernel / 2, groups, bias, o));
}

GLUMBConvImpl::GLUMBConvImpl(int64_t hidden, int64_t mh, const torch::TensorOptions& o) {
  inverted_conv = register_module("inverted_conv", ConvLayer(hidden, 2 * mh, 1, 1, true, o));
  depth_conv = register_module("depth_conv", ConvLayer(2 * mh, 2 * mh, 3, 2 * mh, true, o));
  point_conv = register_module("point_conv", ConvLayer(mh, hidden, 1, 1, false, o));
}

// Upstream lays the tokens out as a [B, C, h, w] image for its three convolutions and back
// (two transposes of the image forward, two backward, and a layer norm that copies the
// transposed result). Here the 1x1 convolutions are products over the tokens and the
// depthwise 3x3 runs on a channels-last view of them (the same kernel), so no transposes.
// With fused_kernels, silu -> depthwise -> gate is one CUDA kernel each way where it applies
// (a plain depthwise layer: not a frozen or adapted one).
torch::Tensor GLUMBConvImpl::forward(const torch::Tensor& x, int64_t h, int64_t w) {
  const int64_t B = x.size(0), N = x.size(1);
  auto t = inverted_conv->conv->forward_tokens(x, h, w);  // [B, N, 2H]
  const auto& depthwise = *depth_conv->conv;
  if (fused_kernels && typeid(depthwise) == typeid(Conv2dImpl)) {
    const auto weight = depthwise.product_weight();
    if (fused_silu_dwconv_glu_applies(t, weight, depthwise.bias, h, w)) {
      return point_conv->conv->forward_tokens(fused_silu_dwconv_glu(t, weight, depthwise.bias, h, w), h, w);
    }
  }
  t = depth_conv->forward(torch::silu(t).reshape({B, h, w, t.size(2)}).permute({0, 3, 1, 2}));
  t = glu_gate(t.permute({0, 2, 3, 1}).reshape({B, N, t.size(1)}));  // [B, N, H]
  return point_conv->conv->forward_tokens(t, h, w);
}

// --- Block ------------------------------------------------------------------------------

SanaMSBlockImpl::SanaMSBlockImpl(const ModelSpec& s, const torch::TensorOptions& o) {
  attn = register_module("attn", LiteLA(s, o));
  if (s.conditioning != Conditioning::none) {
    cross_attn = register_module("cross_attn", CrossAttention(s.hidden, s.cross_heads, s.cross_norm, o));
  }
  mlp = register_module("mlp", GLUMBConv(s.hidden, s.mlp_hidden(), o));
  scale_shift_table = register_parameter("scale_shift_table", make({6, s.hidden}, o));
}

std::vector<torch::Tensor> SanaMSBlockImpl::differentiable() const {
  auto out = parameters();
  for (const auto& m : modules(/*include_self=*/false)) {
    std::vector<torch::Tensor> extra;
    if (const auto* linear = m->as<LinearImpl>()) extra = linear->extra_inputs();
    if (const auto* conv = m->as<Conv2dImpl>()) extra = conv->extra_inputs();
    out.insert(out.end(), extra.begin(), extra.end());
  }
  return out;
}

torch::Tensor SanaMSBlockImpl::forward(const torch::Tensor& x_in, const torch::Tensor& y,
                                       const torch::Tensor& t0, const torch::Tensor& bias,
                                       int64_t h, int64_t w) {
  const int64_t B = x_in.size(0), C = x_in.size(2);
  const auto mod = (scale_shift_table.unsqueeze(0) + t0.reshape({B, 6, C})).chunk(6, 1);
  // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp: each [B, 1, C]
  // x + gate * f(x), each in one pass (addcmul).
  auto x = torch::addcmul(x_in, mod[2], attn->forward(norm_modulate(x_in, mod[0], mod[1], fused_kernels)));
  if (cross_attn) x = x + cross_attn->forward(x, y, bias);
  return torch::addcmul(x, mod[5], mlp->forward(norm_modulate(x, mod[3], mod[4], fused_kernels), h, w));
}

// --- Top level --------------------------------------------------------------------------

PatchEmbedImpl::PatchEmbedImpl(const ModelSpec& s, const torch::TensorOptions& o) {
  // kernel = stride = patch; an odd kernel gets "same" padding, as upstream.
  const int64_t pad = s.patch % 2 == 1 ? s.patch / 2 : 0;
  layer("proj", proj, Conv2d(s.in_channels, s.hidden, s.patch, s.patch, pad, 1, true, o));
}

// The image goes in channels-last, so the convolution's output is already the tokens
// [B, N, C] in memory. Upstream's flatten(2).transpose(1, 2) leaves a transposed view that
// every residual sum after it inherits, and each layer norm then copies.
torch::Tensor PatchEmbedImpl::forward(const torch::Tensor& x) {
  const auto y = proj->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
  return y.permute({0, 2, 3, 1}).reshape({y.size(0), -1, y.size(1)});
}

TimestepMlpImpl::TimestepMlpImpl(int64_t in, int64_t hidden, const torch::TensorOptions& o) {
  layer("0", first, Linear(in, hidden, true, o));
  layer("2", second, Linear(hidden, hidden, true, o));
}

TimeBlockImpl::TimeBlockImpl(int64_t hidden, const torch::TensorOptions& o) {
  layer("1", linear, Linear(hidden, 6 * hidden, true, o));
}

TimestepEmbedderImpl::TimestepEmbedderImpl(int64_t hidden, const torch::TensorOptions& o) {
  mlp = register_module("mlp", TimestepMlp(256, hidden, o));
}

torch::Tensor timestep_features(const torch::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  const auto dtype = t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  // Made where t is: no host-to-device copy in the step.
  const auto freqs = torch::exp(-std::log(10000.0) *
                                torch::arange(half, torch::TensorOptions().dtype(dtype).device(t.device())) /
                                static_cast<double>(half));
  const auto args = t.to(dtype).unsqueeze(1) * freqs.unsqueeze(0);
  auto emb = torch::cat({torch::cos(args), torch::sin(args)}, -1);
  if (dim % 2) emb = torch::cat({emb, torch::zeros_like(emb.narrow(1, 0, 1))}, -1);
  return emb;
}

torch::Tensor TimestepEmbedderImpl::forward(const torch::Tensor& t) {
  const auto dtype = mlp->first->compute_dtype();
  return mlp->forward(timestep_features(t).to(dtype));
}

MlpImpl::MlpImpl(int64_t in, int64_t hidden, const torch::TensorOptions& o) {
  layer("fc1", fc1, Linear(in, hidden, true, o));
  layer("fc2", fc2, Linear(hidden, hidden, true, o));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return fc2->forward(torch::gelu(fc1->forward(x), "tanh"));
}

CaptionEmbedderImpl::CaptionEmbedderImpl(const ModelSpec& s, const torch::TensorOptions& o) {
  y_proj = register_module("y_proj", Mlp(s.caption_channels, s.hidden, o));
  y_embedding = register_buffer("y_embedding", make({s.caption_tokens, s.caption_channels}, o));
}

torch::Tensor CaptionEmbedderImpl::forward(const torch::Tensor& y_in, const torch::Tensor& drop) {
  if (y_in.dim() != 3 || y_in.size(1) != y_embedding.size(0) || y_in.size(2) != y_embedding.size(1)) {
    throw std::invalid_argument(fmt::format(
        "caption features have shape {}, the model takes [batch, {}, {}] "
        "(text_encoder.model_max_length, text_encoder.caption_channels)",
        fmt::join(y_in.sizes(), "x"), y_embedding.size(0), y_embedding.size(1)));
  }
  auto y = y_in.to(y_embedding.scalar_type());
  if (drop.defined()) y = torch::where(drop.to(y.device()).view({-1, 1, 1}), y_embedding.unsqueeze(0), y);
  return y_proj->forward(y);
}

TableImpl::TableImpl(int64_t rows, int64_t cols, const torch::TensorOptions& o) {
  weight = register_parameter("weight", make({rows, cols}, o));
}

LabelEmbedderImpl::LabelEmbedderImpl(const ModelSpec& s, const torch::TensorOptions& o)
    : num_classes(s.num_classes) {
  embedding_table = register_module("embedding_table", Table(s.num_classes + 1, s.hidden, o));
}

torch::Tensor LabelEmbedderImpl::forward(const torch::Tensor& labels_in, const torch::Tensor& drop) {
  auto labels = labels_in.to(torch::kLong);
  if (labels.numel() > 0) {
    const int64_t lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
    if (lo < 0 || hi >= num_classes) {
      throw std::invalid_argument(fmt::format(
          "class label {} is outside [0, {}) (model.num_classes); samples without a label "
          "cannot train a class-conditional model",
          lo < 0 ? lo : hi, num_classes));
    }
  }
  if (drop.defined()) labels = torch::where(drop.to(labels.device()), torch::full_like(labels, num_classes), labels);
  return torch::embedding(embedding_table->weight, labels).unsqueeze(1);
}

FinalLayerImpl::FinalLayerImpl(const ModelSpec& s, const torch::TensorOptions& o) {
  layer("linear", linear, Linear(s.hidden, s.patch * s.patch * s.out_channels, true, o));
  scale_shift_table = register_parameter("scale_shift_table", make({2, s.hidden}, o));
}

torch::Tensor FinalLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& t) {
  const auto mod = (scale_shift_table.unsqueeze(0) + t.unsqueeze(1)).chunk(2, 1);
  return linear->forward(norm_modulate(x, mod[0], mod[1], fused_kernels));
}

SanaMSImpl::SanaMSImpl(const ModelSpec& spec, const BuildOptions& options) : spec_(spec) {
  auto o = torch::TensorOptions().dtype(options.dtype);
  if (options.meta) o = o.device(torch::kMeta);
  x_embedder = register_module("x_embedder", PatchEmbed(spec, o));
  t_embedder = register_module("t_embedder", TimestepEmbedder(spec.hidden, o));
  if (spec.cfg_embed) cfg_embedder = register_module("cfg_embedder", TimestepEmbedder(spec.hidden, o));
  t_block = register_module("t_block", TimeBlock(spec.hidden, o));
  if (spec.conditioning == Conditioning::caption) {
    caption_embedder = register_module("y_embedder", CaptionEmbedder(spec, o));
  } else if (spec.conditioning == Conditioning::class_label) {
    label_embedder = register_module("y_embedder", LabelEmbedder(spec, o));
  }
  if (spec.conditioning != Conditioning::none && spec.y_norm) {
    attention_y_norm = register_module("attention_y_norm", RMSNorm(spec.hidden, spec.y_norm_scale, spec.norm_eps, o));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.depth; ++i) blocks->push_back(SanaMSBlock(spec, o));
  final_layer = register_module("final_layer", FinalLayer(spec, o));
  if (spec.logvar) logvar_linear = register_module("logvar_linear", Linear(spec.hidden, 1, true, o));
  if (spec.control_blocks > 0) {
    controlnet = register_module("controlnet", torch::nn::ModuleList());
    for (int64_t i = 0; i < spec.control_blocks; ++i) controlnet->push_back(ControlSanaMSBlock(spec, i, o));
  }
  if (!options.meta) initialize(options.seed);
}

std::pair<torch::Tensor, torch::Tensor> SanaMSImpl::embed_condition(const Condition& cond, int64_t batch) {
  if (spec_.conditioning == Conditioning::none) return {};
  if (!cond.y.defined()) {
    throw std::invalid_argument(fmt::format("{} is {}-conditional but the batch has no {}", spec_.name,
                                            conditioning_name(spec_.conditioning),
                                            spec_.conditioning == Conditioning::caption ? "caption features" : "labels"));
  }
  if (cond.y.size(0) != batch) {
    throw std::invalid_argument(fmt::format("condition batch {} != image batch {}", cond.y.size(0), batch));
  }
  torch::Tensor y = caption_embedder ? caption_embedder->forward(cond.y, cond.drop)
                                     : label_embedder->forward(cond.y, cond.drop);
  if (attention_y_norm) y = attention_y_norm->forward(y);
  torch::Tensor bias;
  if (cond.mask.defined() && caption_embedder) {
    bias = ((1 - cond.mask.to(y.scalar_type())) * -10000.0).view({batch, 1, 1, -1});
  }
  return {y, bias};
}

torch::Tensor SanaMSImpl::forward(const torch::Tensor& x, const torch::Tensor& timestep, const Condition& cond,
                                  torch::Tensor* logvar) {
  return run(x, timestep, cond, logvar, nullptr, nullptr);
}

std::vector<torch::Tensor> SanaMSImpl::block_outputs(const torch::Tensor& x, const torch::Tensor& timestep,
                                                     const Condition& cond, const std::vector<int64_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= spec_.depth || (i > 0 && ids[i] <= ids[i - 1])) {
      throw std::invalid_argument(fmt::format("block_outputs: blocks [{}] are not ascending indexes of {}'s {} blocks",
                                              fmt::join(ids, ", "), spec_.name, spec_.depth));
    }
  }
  TORCH_CHECK(hooks_.empty(), "block_outputs: a model with block hooks runs whole forwards only");
  std::vector<torch::Tensor> out;
  if (!ids.empty()) run(x, timestep, cond, nullptr, &ids, &out);
  return out;
}

torch::Tensor SanaMSImpl::run(const torch::Tensor& x_in, const torch::Tensor& timestep, const Condition& cond,
                              torch::Tensor* logvar, const std::vector<int64_t>* capture,
                              std::vector<torch::Tensor>* captured) {
  const int64_t B = x_in.size(0), p = spec_.patch;
  if (x_in.dim() != 4 || x_in.size(1) != spec_.in_channels || x_in.size(2) % p || x_in.size(3) % p) {
    throw std::invalid_argument(fmt::format(
        "{} takes [batch, {}, H, W] with H and W multiples of {}, got {}", spec_.name,
        spec_.in_channels, p, fmt::join(x_in.sizes(), "x")));
  }
  const int64_t h = x_in.size(2) / p, w = x_in.size(3) / p;
  for (auto* h : hooks_) h->forward_begins();
  const auto dtype = x_embedder->proj->compute_dtype();
  auto x = x_embedder->forward(x_in.to(dtype));
  if (spec_.use_pe) x = x + pos_embed(h, w, x);
  // Upstream's forward divides by timestep_norm_scale_factor where it is not 1, else
  // truncates (timestep.long()): the sampler's 1000 sigma too. Times are float32 as
  // upstream's, float64 in a float64 model.
  const auto time_dtype = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto flat = timestep.reshape({B});
  auto t = t_embedder->forward(spec_.timestep_norm_scale != 1.0 ? flat.to(time_dtype) / spec_.timestep_norm_scale
                               : spec_.integer_timesteps      ? flat.trunc()
                                                              : flat);
  if (cfg_embedder) {  // upstream: t += cfg_embedder(cfg_scale * cfg_embed_scale)
    TORCH_CHECK(cond.cfg_scale.defined() && cond.cfg_scale.numel() == B,
                "model.cfg_embed: the forward needs each sample's guidance scale (Condition::cfg_scale, [B])");
    t = t + cfg_embedder->forward(cond.cfg_scale.reshape({B}).to(time_dtype) * spec_.cfg_embed_scale);
  }
  if (logvar != nullptr && logvar_linear) *logvar = logvar_linear->forward(t) * spec_.logvar_scale;
  const auto t0 = t_block->forward(t);
  const auto [y, bias] = embed_condition(cond, B);
  const bool checkpoint = grad_checkpointing_ && is_training() && torch::GradMode::is_enabled();
  // ControlNet: the control latent's tokens through the base's patch embedding (no position
  // embedding, as upstream's forward_controlnet without rope), then the copied blocks.
  const bool control = controlnet && cond.control.defined();
  torch::Tensor ctl = control ? x_embedder->forward(cond.control.to(dtype)) : torch::Tensor();
  int64_t index = 0;
  for (auto& m : *blocks) {
    auto* block = m->as<SanaMSBlockImpl>();
    const int64_t k = index++;
    for (auto* h : hooks_) h->block_forward(k, true);
    if (control && k >= 1 && k <= spec_.control_blocks) {
      auto* cb = controlnet[static_cast<size_t>(k - 1)]->as<ControlSanaMSBlockImpl>();
      const bool every = checkpoint && (k - 1) % checkpoint_every_ == 0;
      ctl = run_block(cb->copied_block.get(), cb->before_proj ? x + cb->before_proj->forward(ctl) : ctl, y, t0, bias, h, w,
                    every);
      x = x + cb->after_proj->forward(ctl) * cond.control_scale;
    }
    x = run_block(block, x, y, t0, bias, h, w, checkpoint && k % checkpoint_every_ == 0);
    if (capture != nullptr && std::find(capture->begin(), capture->end(), k) != capture->end()) {
      captured->push_back(x);
      if (k == capture->back()) return {};
    }
    if (!hooks_.empty()) {
      for (auto* h : hooks_) h->block_forward(k, false);
      if (x.requires_grad()) {
        x.register_hook([g = hooks_, k](const torch::Tensor&) {
          for (auto* h : g) h->backward_reaches(k);
        });
      }
    }
  }
  x = final_layer->forward(x, t);  // [B, N, p*p*c]
  for (auto* h : hooks_) h->forward_ends(x.requires_grad());
  const int64_t c = spec_.out_channels;
  return x.reshape({B, h, w, p, p, c}).permute({0, 5, 1, 3, 2, 4}).reshape({B, c, h * p, w * p});
}

torch::Tensor SanaMSImpl::pos_embed(int64_t h, int64_t w, const torch::Tensor& like) {
  auto& cached = pos_embed_cache_[{h, w}];  // one per bucket shape: sin/cos of a big grid is slow
  if (!cached.defined() || cached.device() != like.device() || cached.scalar_type() != like.scalar_type()) {
    cached = sincos_pos_embed(spec_.hidden, h, w, spec_.pe_interpolation, spec_.pe_base_size)
                 .to(like.device(), like.scalar_type())
                 .unsqueeze(0);
  }
  return cached;
}

std::vector<std::pair<std::string, int64_t>> SanaMSImpl::parameter_counts() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& child : named_children()) {
    int64_t n = 0;
    for (const auto& p : child.value()->parameters()) n += p.numel();
    out.emplace_back(child.key(), n);
  }
  return out;
}

int64_t SanaMSImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void SanaMSImpl::add_block_hooks(BlockHooks* hooks) {
  TORCH_CHECK(hooks != nullptr && std::find(hooks_.begin(), hooks_.end(), hooks) == hooks_.end(),
              "add_block_hooks: null, or added already");
  hooks_.push_back(hooks);
}

void SanaMSImpl::remove_block_hooks(BlockHooks* hooks) {
  hooks_.erase(std::remove(hooks_.begin(), hooks_.end(), hooks), hooks_.end());
}

void SanaMSImpl::set_fused_kernels(bool on) {
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* block = m->as<SanaMSBlockImpl>()) block->fused_kernels = on;
    if (auto* final_layer = m->as<FinalLayerImpl>()) final_layer->fused_kernels = on;
    if (auto* mlp = m->as<GLUMBConvImpl>()) mlp->fused_kernels = on;
    if (auto* attention = m->as<LiteLAImpl>()) attention->fused_kernels = on;
  }
}

}  // namespace sana::model
