#include "sana/model/gemma2.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <map>

#include "sana/model/hf_weights.h"
#include "sana/model/weights.h"

namespace sana::model {

namespace {

// torch.finfo(dtype).min, which transformers' eager attention adds to masked scores.
double lowest_of(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat64: return std::numeric_limits<double>::lowest();
    case torch::kBFloat16: return static_cast<float>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kFloat16: return static_cast<float>(std::numeric_limits<c10::Half>::lowest());
    default: return std::numeric_limits<float>::lowest();
  }
}

}  // namespace

bool is_gemma2_config(const nlohmann::json& config) {
  if (!config.is_object()) return false;
  if (config.value("model_type", "") == "gemma2") return true;
  if (config.contains("architectures") && config.at("architectures").is_array()) {
    for (const auto& a : config.at("architectures")) {
      if (a == "Gemma2ForCausalLM" || a == "Gemma2Model") return true;
    }
  }
  return false;
}

Gemma2Config Gemma2Config::from_json(const nlohmann::json& c, const std::string& where) {
  if (!is_gemma2_config(c)) {
    throw WeightsError(fmt::format("{}: model_type is {}, not gemma2 (Gemma-2 is the text encoder built in; give "
                                   "Gemma-2's transformers folder, e.g. Efficient-Large-Model/gemma-2-2b-it)",
                                   where, c.is_object() && c.contains("model_type") ? c.at("model_type").dump() : "missing"));
  }
  Gemma2Config g;
  // transformers' Gemma2Config defaults (those of gemma-2-2b).
  g.vocab_size = config_field<int64_t>(c, "vocab_size", 256000, 0, where);
  g.hidden_size = config_field<int64_t>(c, "hidden_size", 2304, 0, where);
  g.intermediate_size = config_field<int64_t>(c, "intermediate_size", 9216, 0, where);
  g.layers = config_field<int64_t>(c, "num_hidden_layers", 26, 0, where);
  g.heads = config_field<int64_t>(c, "num_attention_heads", 8, 0, where);
  g.kv_heads = config_field<int64_t>(c, "num_key_value_heads", 4, 0, where);
  g.head_dim = config_field<int64_t>(c, "head_dim", 256, 0, where);
  g.rms_norm_eps = config_field<double>(c, "rms_norm_eps", 1e-6, 1e-6, where);
  g.query_pre_attn_scalar = config_field<double>(c, "query_pre_attn_scalar", 256, 256, where);
  g.attn_softcap = config_field<double>(c, "attn_logit_softcapping", 50.0, 0.0, where);
  g.sliding_window = config_field<int64_t>(c, "sliding_window", 4096, 0, where);
  g.attention_bias = config_field<bool>(c, "attention_bias", false, false, where);
  // transformers 5 writes rope_parameters {rope_theta, rope_type}; earlier ones rope_theta.
  const auto rope = c.contains("rope_parameters") && c.at("rope_parameters").is_object() ? c.at("rope_parameters")
                                                                                         : nlohmann::json::object();
  g.rope_theta = config_field<double>(rope.contains("rope_theta") ? rope : c, "rope_theta", 10000.0, 10000.0, where);
  const auto rope_type = [](const nlohmann::json& r) {
    return r.is_object() ? r.value("rope_type", r.value("type", std::string("default"))) : std::string("default");
  };
  for (const auto& type : {rope_type(rope), rope_type(c.value("rope_scaling", nlohmann::json()))}) {
    if (type != "default") {
      throw WeightsError(fmt::format("{}: rope_type {}; the Gemma-2 built in uses the default RoPE", where, type));
    }
  }
  if (config_field<bool>(c, "use_bidirectional_attention", false, false, where)) {
    throw WeightsError(fmt::format("{}: use_bidirectional_attention is true; the Gemma-2 built in is the causal "
                                   "decoder upstream encodes captions with",
                                   where));
  }
  const std::string act = c.value("hidden_activation", c.value("hidden_act", std::string("gelu_pytorch_tanh")));
  if (act != "gelu_pytorch_tanh" && act != "gelu") {
    throw WeightsError(fmt::format("{}: hidden_activation {} is not supported (gelu_pytorch_tanh, gelu)", where, act));
  }
  g.gelu_tanh = act == "gelu_pytorch_tanh";
  if (g.hidden_size <= 0 || g.heads <= 0 || g.kv_heads <= 0 || g.head_dim <= 0 || g.layers <= 0 ||
      g.heads % g.kv_heads != 0 || g.head_dim % 2 != 0) {
    throw WeightsError(fmt::format("{}: sizes do not make a Gemma-2 (hidden_size {}, heads {}, key-value heads {}, "
                                   "head_dim {}, layers {})",
                                   where, g.hidden_size, g.heads, g.kv_heads, g.head_dim, g.layers));
  }
  if (c.contains("layer_types") && c.at("layer_types").is_array()) {
    for (const auto& t : c.at("layer_types")) {
      if (t != "sliding_attention" && t != "full_attention") {
        throw WeightsError(fmt::format("{}: layer_types holds {} (sliding_attention or full_attention)", where, t.dump()));
      }
      g.sliding.push_back(t == "sliding_attention");
    }
    if (static_cast<int64_t>(g.sliding.size()) != g.layers) {
      throw WeightsError(fmt::format("{}: layer_types has {} entries for {} layers", where, g.sliding.size(), g.layers));
    }
  } else {
    for (int64_t i = 0; i < g.layers; ++i) g.sliding.push_back(i % 2 == 0);  // transformers' default
  }
  return g;
}

int64_t Gemma2Config::parameters() const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const int64_t attention = hidden_size * (q + 2 * kv) + q * hidden_size +
                            (attention_bias ? q + 2 * kv + hidden_size : 0);
  const int64_t layer = attention + 3 * hidden_size * intermediate_size + 4 * hidden_size;
  return vocab_size * hidden_size + layers * layer + hidden_size;
}

Gemma2 Gemma2::load(const std::string& folder, torch::Device device, torch::ScalarType dtype) {
  Gemma2 m;
  m.cfg_ = Gemma2Config::from_json(read_hf_config(folder), folder + "/config.json");
  if (!holds_hf_weights(folder, "model")) {
    throw WeightsError(fmt::format("{}: no model.safetensors (nor its index); Gemma-2's folder holds its weights as "
                                   "safetensors",
                                   folder));
  }
  auto tensors = read_hf_weights(folder, "model");
  const auto& c = m.cfg_;
  std::vector<std::string> problems;
  // A tensor by its name in Gemma2ForCausalLM ("model." prefix) or in Gemma2Model (none).
  const auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors.find("model." + name);
    if (it == tensors.end()) it = tensors.find(name);
    if (it == tensors.end()) {
      problems.push_back(fmt::format("{} missing", name));
      return torch::Tensor();
    }
    if (it->second.sizes() != at::IntArrayRef(shape)) {
      problems.push_back(fmt::format("{} is {}, the config makes it {}", name, it->second.sizes(), at::IntArrayRef(shape)));
      return torch::Tensor();
    }
    auto t = it->second.to(device, dtype).contiguous();
    tensors.erase(it);
    return t;
  };
  const int64_t H = c.hidden_size, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim, I = c.intermediate_size;
  m.embed_ = take("embed_tokens.weight", {c.vocab_size, H});
  m.final_norm_ = take("norm.weight", {H});
  for (int64_t i = 0; i < c.layers; ++i) {
    const auto p = fmt::format("layers.{}.", i);
    Layer l;
    l.q = take(p + "self_attn.q_proj.weight", {q, H});
    l.k = take(p + "self_attn.k_proj.weight", {kv, H});
    l.v = take(p + "self_attn.v_proj.weight", {kv, H});
    l.o = take(p + "self_attn.o_proj.weight", {H, q});
    if (c.attention_bias) {
      l.q_bias = take(p + "self_attn.q_proj.bias", {q});
      l.k_bias = take(p + "self_attn.k_proj.bias", {kv});
      l.v_bias = take(p + "self_attn.v_proj.bias", {kv});
      l.o_bias = take(p + "self_attn.o_proj.bias", {H});
    }
    l.input_norm = take(p + "input_layernorm.weight", {H});
    l.post_attention_norm = take(p + "post_attention_layernorm.weight", {H});
    l.pre_feedforward_norm = take(p + "pre_feedforward_layernorm.weight", {H});
    l.post_feedforward_norm = take(p + "post_feedforward_layernorm.weight", {H});
    l.gate = take(p + "mlp.gate_proj.weight", {I, H});
    l.up = take(p + "mlp.up_proj.weight", {I, H});
    l.down = take(p + "mlp.down_proj.weight", {H, I});
    m.layers_.push_back(std::move(l));
  }
  tensors.erase("lm_head.weight");  // tied to the embedding; a decoder has no head
  for (const auto& [name, t] : tensors) problems.push_back(fmt::format("{} unexpected", name));
  if (!problems.empty()) {
    throw WeightsError(fmt::format("{}: the weights do not make the Gemma-2 its config.json describes:{}", folder,
                                   problem_list(problems)));
  }
  return m;
}

int64_t Gemma2::bytes() const {
  int64_t n = embed_.nbytes() + final_norm_.nbytes();
  for (const auto& l : layers_) {
    for (const auto* t : {&l.q, &l.k, &l.v, &l.o, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias, &l.input_norm,
                          &l.post_attention_norm, &l.pre_feedforward_norm, &l.post_feedforward_norm, &l.gate, &l.up,
                          &l.down}) {
      if (t->defined()) n += static_cast<int64_t>(t->nbytes());
    }
  }
  return n;
}

torch::Tensor Gemma2::norm(const torch::Tensor& x, const torch::Tensor& w) const {
  const bool half = x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat16;
  const auto f = half ? x.to(torch::kFloat32) : x;
  const auto y = f * torch::rsqrt(f.pow(2).mean(-1, true) + cfg_.rms_norm_eps) * (1.0 + w.to(f.scalar_type()));
  return y.to(x.scalar_type());
}

torch::Tensor Gemma2::attention(const Layer& l, const torch::Tensor& x, const torch::Tensor& cos,
                                const torch::Tensor& sin, const torch::Tensor& mask) const {
  const int64_t N = x.size(0), T = x.size(1), D = cfg_.head_dim;
  const auto heads = [&](const torch::Tensor& w, const torch::Tensor& b) {
    return torch::linear(x, w, b).view({N, T, -1, D}).transpose(1, 2);  // [N, heads, T, D]
  };
  const auto rotate = [&](const torch::Tensor& t) {  // RoPE: t cos + rotate_half(t) sin
    const auto halves = t.chunk(2, -1);
    return t * cos + torch::cat({-halves[1], halves[0]}, -1) * sin;
  };
  const auto q = rotate(heads(l.q, l.q_bias));
  auto k = rotate(heads(l.k, l.k_bias));
  auto v = heads(l.v, l.v_bias);
  const int64_t groups = cfg_.heads / cfg_.kv_heads;
  if (groups > 1) {  // each key-value head serves `groups` query heads
    k = k.unsqueeze(2).expand({N, cfg_.kv_heads, groups, T, D}).reshape({N, cfg_.heads, T, D});
    v = v.unsqueeze(2).expand({N, cfg_.kv_heads, groups, T, D}).reshape({N, cfg_.heads, T, D});
  }
  auto scores = torch::matmul(q, k.transpose(2, 3)) * std::pow(cfg_.query_pre_attn_scalar, -0.5);
  if (cfg_.attn_softcap > 0) scores = torch::tanh(scores / cfg_.attn_softcap) * cfg_.attn_softcap;
  const auto weights = torch::softmax(scores + mask, -1, torch::kFloat32).to(q.scalar_type());
  const auto out = torch::matmul(weights, v).transpose(1, 2).reshape({N, T, cfg_.heads * D});
  return torch::linear(out, l.o, l.o_bias);
}

torch::Tensor Gemma2::forward(const torch::Tensor& ids, const torch::Tensor& mask) const {
  c10::InferenceMode inference;
  const auto device = embed_.device();
  const auto dtype = embed_.scalar_type();
  const int64_t T = ids.size(1);
  // sqrt(hidden) as a float32 value in the weights' type, as transformers' embed_scale buffer.
  const auto scale = torch::tensor(static_cast<float>(std::sqrt(static_cast<double>(cfg_.hidden_size)))).to(dtype);
  auto h = embed_.index_select(0, ids.to(device).reshape({-1})).view({ids.size(0), T, -1}) * scale.to(device);
  // RoPE tables in fp32, then the activations' type: [1, 1, T, head_dim].
  const auto inv = 1.0 / torch::pow(cfg_.rope_theta,
                                    torch::arange(0, cfg_.head_dim, 2, torch::kFloat32) / static_cast<double>(cfg_.head_dim));
  const auto freqs = torch::arange(T, torch::kFloat32).unsqueeze(1) * inv.unsqueeze(0);
  const auto angles = torch::cat({freqs, freqs}, -1);
  const auto cos = angles.cos().to(device, dtype).view({1, 1, T, -1});
  const auto sin = angles.sin().to(device, dtype).view({1, 1, T, -1});
  // Additive masks [N, 1, T, T]: 0 where query i may see key j, the type's lowest value elsewhere.
  const auto opts = torch::TensorOptions().device(device);
  const auto i = torch::arange(T, opts.dtype(torch::kInt64)).view({T, 1});
  const auto j = torch::arange(T, opts.dtype(torch::kInt64)).view({1, T});
  const auto causal = (j <= i).view({1, 1, T, T}) & mask.to(device).to(torch::kBool).view({-1, 1, 1, T});
  const auto zero = torch::zeros({}, opts.dtype(dtype)), lowest = torch::full({}, lowest_of(dtype), opts.dtype(dtype));
  const auto full_mask = torch::where(causal, zero, lowest);
  const auto sliding_mask = cfg_.sliding_window > 0
                                ? torch::where(causal & (j > i - cfg_.sliding_window).view({1, 1, T, T}), zero, lowest)
                                : full_mask;
  for (size_t n = 0; n < layers_.size(); ++n) {
    const auto& l = layers_[n];
    const auto& m = cfg_.sliding[n] && cfg_.sliding_window > 0 ? sliding_mask : full_mask;
    h = h + norm(attention(l, norm(h, l.input_norm), cos, sin, m), l.post_attention_norm);
    const auto x = norm(h, l.pre_feedforward_norm);
    const auto gate = torch::gelu(torch::linear(x, l.gate), cfg_.gelu_tanh ? "tanh" : "none");
    h = h + norm(torch::linear(gate * torch::linear(x, l.up), l.down), l.post_feedforward_norm);
  }
  return norm(h, final_norm_);
}

}  // namespace sana::model
