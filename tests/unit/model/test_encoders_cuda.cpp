// The native encoders as a GPU run uses them: bf16 on CUDA (upstream's dtype). Random weights
// written as their Hugging Face folders; each network's bf16 CUDA output against the same
// folder in fp32 on the CPU (whose equality with diffusers and transformers reference.model
// checks), and what they hold on the device against the count `sana-train model` uses.
// [cuda]: run by torch.cuda where a GPU is visible (scripts/gpu_check.sh).
#include "catch.h"

#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/model/dc_ae.h"
#include "sana/model/gemma2.h"
#include "sana/util/safetensors.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana;

namespace {

// Random weights for `shapes`: norm weights near 1, the rest small.
NamedTensors random_weights(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  NamedTensors out;
  for (const auto& [name, shape] : shapes) {
    const bool norm = name.find("norm") != std::string::npos && name.find("weight") != std::string::npos;
    out.emplace_back(name, norm ? 1 + 0.2 * torch::randn(shape) : 0.2 * torch::randn(shape));
  }
  return out;
}

}  // namespace

TEST_CASE("the native DC-AE and Gemma-2 in bf16 on CUDA are their fp32 selves on the CPU", "[cuda][model]") {
  if (!torch::cuda::is_available()) FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  torch::manual_seed(5);
  sana::test::TempDir dir;
  const torch::Device gpu(torch::kCUDA);
  // DC-AE: Sana's shape, small.
  const nlohmann::json dc = {
      {"_class_name", "AutoencoderDC"}, {"in_channels", 3}, {"latent_channels", 4}, {"attention_head_dim", 8},
      {"encoder_block_types", {"ResBlock", "ResBlock", "EfficientViTBlock"}},
      {"decoder_block_types", {"ResBlock", "ResBlock", "EfficientViTBlock"}},
      {"encoder_block_out_channels", {8, 16, 32}}, {"decoder_block_out_channels", {8, 16, 32}},
      {"encoder_layers_per_block", {1, 1, 2}}, {"decoder_layers_per_block", {1, 2, 2}},
      {"encoder_qkv_multiscales", {nlohmann::json::array(), nlohmann::json::array(), {5}}},
      {"decoder_qkv_multiscales", {nlohmann::json::array(), nlohmann::json::array(), {5}}},
      {"downsample_block_type", "Conv"}, {"upsample_block_type", "interpolate"}, {"scaling_factor", 0.41407}};
  const auto vae_dir = dir.path("vae");
  std::filesystem::create_directories(vae_dir);
  std::ofstream(vae_dir + "/config.json") << dc.dump();
  const auto config = model::DcAeConfig::from_json(dc, "the test's config");
  write_safetensors(vae_dir + "/diffusion_pytorch_model.safetensors", random_weights(model::DcAe::tensor_shapes(config)));
  const auto cpu_vae = model::DcAe::load(vae_dir, torch::kCPU, torch::kFloat32);
  const auto gpu_vae = model::DcAe::load(vae_dir, gpu, torch::kBFloat16);
  CHECK(gpu_vae.bytes() == config.elements() * 2);
  const auto images = torch::rand({2, 3, 32, 32}) * 2 - 1;
  const auto z = gpu_vae.encode(images.to(gpu, torch::kBFloat16));
  CHECK(z.is_cuda());
  CHECK(z.scalar_type() == torch::kBFloat16);
  const auto z_cpu = cpu_vae.encode(images);
  CHECK(sana::test::rel_diff(z.cpu().to(torch::kFloat32), z_cpu) < 3e-2);
  CHECK(sana::test::rel_diff(gpu_vae.decode(z_cpu.to(gpu, torch::kBFloat16)).cpu().to(torch::kFloat32),
                             cpu_vae.decode(z_cpu)) < 3e-2);
  // Gemma-2: 2 layers, a sliding window below the prompt, soft-capping, 4 query heads on 2.
  const nlohmann::json gc = {{"model_type", "gemma2"}, {"vocab_size", 64}, {"hidden_size", 32},
                             {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                             {"num_key_value_heads", 2}, {"head_dim", 8}, {"query_pre_attn_scalar", 8},
                             {"attn_logit_softcapping", 2.0}, {"sliding_window", 4},
                             {"hidden_activation", "gelu_pytorch_tanh"}};
  const auto text_dir = dir.path("gemma");
  std::filesystem::create_directories(text_dir);
  std::ofstream(text_dir + "/config.json") << gc.dump();
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"model.embed_tokens.weight", {64, 32}},
                                                                      {"model.norm.weight", {32}}};
  for (int i = 0; i < 2; ++i) {
    const auto p = "model.layers." + std::to_string(i) + ".";
    for (const auto& [n, s] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"self_attn.q_proj.weight", {32, 32}}, {"self_attn.k_proj.weight", {16, 32}},
             {"self_attn.v_proj.weight", {16, 32}}, {"self_attn.o_proj.weight", {32, 32}},
             {"input_layernorm.weight", {32}}, {"post_attention_layernorm.weight", {32}},
             {"pre_feedforward_layernorm.weight", {32}}, {"post_feedforward_layernorm.weight", {32}},
             {"mlp.gate_proj.weight", {64, 32}}, {"mlp.up_proj.weight", {64, 32}}, {"mlp.down_proj.weight", {32, 64}}}) {
      shapes.emplace_back(p + n, s);
    }
  }
  write_safetensors(text_dir + "/model.safetensors", random_weights(shapes));
  const auto cpu_text = model::Gemma2::load(text_dir, torch::kCPU, torch::kFloat32);
  const auto gpu_text = model::Gemma2::load(text_dir, gpu, torch::kBFloat16);
  CHECK(gpu_text.bytes() == gpu_text.config().parameters() * 2);
  const auto ids = torch::randint(3, 64, {3, 11}, torch::kInt64);
  auto mask = torch::ones({3, 11}, torch::kInt64);
  mask.index_put_({2, torch::indexing::Slice(5)}, 0);
  const auto h = gpu_text.forward(ids, mask);
  CHECK(h.is_cuda());
  CHECK(h.scalar_type() == torch::kBFloat16);
  const auto rows = mask.to(torch::kBool);
  CHECK(sana::test::rel_diff(h.cpu().to(torch::kFloat32).index({rows}), cpu_text.forward(ids, mask).index({rows})) <
        3e-2);
}
