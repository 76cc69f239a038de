// DC-AE, natively: diffusers' AutoencoderDC (the VAE of Sana and SANA-Sprint), encoder and
// decoder, loaded from a diffusers folder (config.json, diffusion_pytorch_model.safetensors or
// its shards and index), frozen, forward only. Every block type its released configs use:
//   - ResBlock: conv 3x3 (bias), activation, conv 3x3 (no bias), a norm over the channels
//     (RMSNorm with weight and bias, or BatchNorm with running statistics), a residual;
//   - EfficientViTBlock: multi-scale linear attention (q, k, v projections, a depthwise k x k
//     and grouped 1x1 aggregation per scale, ReLU kernels, fp32 sums; quadratic attention when
//     the map has no more cells than a head has channels), its norm, a residual; then
//     GLUMBConv (1x1 to 8x, SiLU, depthwise 3x3, GLU gate with SiLU, 1x1 back, RMSNorm, a
//     residual);
//   - down: a 3x3 convolution (stride 2, or stride 1 then pixel-unshuffle) plus the
//     space-to-channel shortcut (pixel-unshuffle, channel groups averaged); up: nearest x2 then
//     3x3, or 3x3 then pixel-shuffle, plus the channel-to-space shortcut (channels repeated,
//     pixel-shuffled); the encoder's out shortcut (channel groups averaged) and the decoder's in
//     shortcut (channels repeated); the decoder's RMSNorm, ReLU and last convolution.
// Block types, depths, widths, scales, norms and activations all come from config.json.
// mit-han-lab's efficientvit layout (dc-ae-f32c32-sana-1.0 and -1.1, without -diffusers: its
// model.safetensors, no diffusers config) is the same network under other names:
// load_efficientvit() renames the tensors as diffusers' converter does and takes the
// architecture from the name.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sana::model {

struct DcAeConfig {
  struct Side {
    std::vector<std::string> block_types;    // per stage: ResBlock or EfficientViTBlock
    std::vector<int64_t> channels, layers;   // per stage
    std::vector<std::vector<int64_t>> scales;  // per stage: the attention's aggregation kernels
    std::vector<std::string> norms, acts;    // per stage (the encoder's: rms_norm, silu)
  };
  int64_t in_channels = 3, latent_channels = 32, head_dim = 32;
  Side encoder, decoder;
  bool pixel_unshuffle = true;  // downsample_block_type pixel_unshuffle (else a stride-2 conv)
  bool interpolate = false;     // upsample_block_type interpolate (else pixel_shuffle)
  bool encoder_out_shortcut = true, decoder_in_shortcut = true;
  std::string decoder_conv_act = "relu";
  double scaling_factor = 1.0;

  // From a diffusers config.json (`where` names it in errors): _class_name AutoencoderDC, with
  // diffusers' defaults for the fields it leaves out. Throws WeightsError naming the field.
  static DcAeConfig from_json(const nlohmann::json& config, const std::string& where);
  // Sana's DC-AE by an efficientvit repository name (efficientvit_names()); false for another.
  static bool for_efficientvit(const std::string& name, DcAeConfig& out);
  // Elements of the weights the config makes: `parameters` as diffusers counts them (BatchNorm's
  // running statistics left out), `elements` all that load() keeps (each in load()'s dtype).
  int64_t parameters() const;
  int64_t elements() const;
  int64_t downsample() const { return int64_t{1} << (encoder.channels.size() - 1); }
};

// The DC-AEs whose efficientvit layout load_efficientvit() reads.
const std::vector<std::string>& efficientvit_names();

// efficientvit's tensor names to diffusers', as diffusers' converter
// (convert_autoencoder_dc_checkpoint_to_diffusers) renames them.
std::map<std::string, torch::Tensor> diffusers_names(std::map<std::string, torch::Tensor> efficientvit);

// Whether a config.json is diffusers' AutoencoderDC.
bool is_dc_ae_config(const nlohmann::json& config);

class DcAe {
 public:
  // From a diffusers folder, as `dtype` on `device`; strict (a missing, unexpected or
  // mis-shaped tensor is a WeightsError listing them).
  static DcAe load(const std::string& folder, torch::Device device, torch::ScalarType dtype);
  // From an efficientvit folder (model.safetensors) of the DC-AE `name` (dc-ae-f32c32-sana-1.1),
  // or of the architecture `config`.
  static DcAe load_efficientvit(const std::string& folder, const std::string& name, torch::Device device,
                                torch::ScalarType dtype);
  static DcAe load_efficientvit(const std::string& folder, const DcAeConfig& config, torch::Device device,
                                torch::ScalarType dtype);
  // images [B, in, H, W] in [-1, 1] -> latents [B, latent, H/f, W/f] (not scaled), and back.
  torch::Tensor encode(const torch::Tensor& images) const;
  torch::Tensor decode(const torch::Tensor& latents) const;
  const DcAeConfig& config() const { return cfg_; }
  int64_t parameters() const;  // the weights' elements, BatchNorm statistics left out
  int64_t bytes() const;

  // Every tensor the config makes (diffusers' names) and its shape, in the module's order.
  static std::vector<std::pair<std::string, std::vector<int64_t>>> tensor_shapes(const DcAeConfig& config);

 private:
  static DcAe from_tensors(std::map<std::string, torch::Tensor> tensors, const DcAeConfig& config,
                           const std::string& where, torch::Device device, torch::ScalarType dtype);
  const torch::Tensor& w(const std::string& name) const;
  torch::Tensor norm(const std::string& prefix, const std::string& type, const torch::Tensor& x) const;
  torch::Tensor res_block(const std::string& p, const std::string& norm_type, const std::string& act,
                          const torch::Tensor& x) const;
  torch::Tensor vit_block(const std::string& p, const std::string& norm_type, size_t scales,
                          const torch::Tensor& x) const;
  torch::Tensor attention(const std::string& p, const std::string& norm_type, size_t scales,
                          const torch::Tensor& x) const;

  DcAeConfig cfg_;
  std::map<std::string, torch::Tensor> w_;  // diffusers' names
  torch::Device device_ = torch::kCPU;
  torch::ScalarType dtype_ = torch::kFloat32;
};

}  // namespace sana::model
