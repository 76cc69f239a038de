// Gemma-2's decoder, natively: transformers' Gemma2Model (what upstream's
// AutoModelForCausalLM.from_pretrained(...).get_decoder() returns), loaded from a
// transformers folder (config.json, model.safetensors or its shards and index), frozen,
// forward only. Its last hidden state is Sana's caption features.
//   - token embeddings times sqrt(hidden_size) (cast to the weights' type first);
//   - per layer: RMSNorm (x * rsqrt(mean x^2 + eps) * (1 + w), in fp32 for half types),
//     grouped-query attention with RoPE, scores scaled by query_pre_attn_scalar^-1/2 and
//     soft-capped (tanh(s / cap) * cap), causal, the padding masked, and on sliding layers
//     only the last sliding_window keys; the norm after it, a residual; then the GeGLU MLP
//     (down(gelu_tanh(gate x) * up x)) between two norms, a residual;
//   - the final norm.
// Masked scores get the type's lowest value added, as transformers' eager attention does, so
// a padded token whose window holds only padding attends evenly, as there.
// Every size comes from config.json: 2b and 9b differ only in it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sana::model {

struct Gemma2Config {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, layers = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0, query_pre_attn_scalar = 256;
  double attn_softcap = 0;     // attn_logit_softcapping (0: none)
  int64_t sliding_window = 0;  // 0: none
  std::vector<bool> sliding;   // per layer: a sliding-window layer (layer_types, else every even one)
  bool attention_bias = false;
  bool gelu_tanh = true;       // hidden_activation gelu_pytorch_tanh (false: exact gelu)

  // From a transformers config.json (`where` names it in errors): model_type gemma2.
  // Throws WeightsError naming the field that is missing or not supported.
  static Gemma2Config from_json(const nlohmann::json& config, const std::string& where);
  // Parameters (the embedding counted once).
  int64_t parameters() const;
};

// Whether a transformers config.json describes Gemma-2 (model_type gemma2, or
// Gemma2ForCausalLM / Gemma2Model among its architectures).
bool is_gemma2_config(const nlohmann::json& config);

class Gemma2 {
 public:
  // From a transformers folder, as `dtype` on `device`. Strict: a missing or mis-shaped
  // tensor is a WeightsError naming it (lm_head, tied to the embedding, is not read).
  static Gemma2 load(const std::string& folder, torch::Device device, torch::ScalarType dtype);
  // ids, mask [N, T] (mask 1 for a token, 0 for padding) -> the last hidden state [N, T, hidden].
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) const;
  const Gemma2Config& config() const { return cfg_; }
  int64_t bytes() const;  // the weights as loaded

 private:
  struct Layer {
    torch::Tensor q, k, v, o, q_bias, k_bias, v_bias, o_bias;
    torch::Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    torch::Tensor gate, up, down;
  };
  torch::Tensor attention(const Layer& l, const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          const torch::Tensor& mask) const;
  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& w) const;

  Gemma2Config cfg_;
  torch::Tensor embed_, final_norm_;
  std::vector<Layer> layers_;
};

}  // namespace sana::model
