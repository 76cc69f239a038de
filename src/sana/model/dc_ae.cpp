// The DC-AE's loading and forward; its layouts (config.json, the tensors, efficientvit's
// names) are dc_ae_layout.cpp's.
#include "sana/model/dc_ae.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sana/model/hf_weights.h"
#include "sana/model/weights.h"

namespace sana::model {

namespace {

namespace F = torch::nn::functional;

constexpr double kNormEps = 1e-5;        // diffusers' RMSNorm and BatchNorm in AutoencoderDC
constexpr double kAttentionEps = 1e-15;  // SanaMultiscaleLinearAttention's

// A 2-d convolution with `padding` on every side (`bias` may be undefined).
torch::Tensor conv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, int64_t stride,
                   int64_t padding, int64_t groups = 1) {
  const c10::optional<torch::Tensor> b = bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt;
  return torch::conv2d(x, weight, b, torch::IntArrayRef{stride, stride}, torch::IntArrayRef{padding, padding},
                       torch::IntArrayRef{1, 1}, groups);
}

torch::Tensor activation(const std::string& name, const torch::Tensor& x) {
  if (name == "silu") return torch::silu(x);
  if (name == "relu6") return torch::clamp(x, 0, 6);
  return torch::relu(x);
}

}  // namespace

DcAe DcAe::load(const std::string& folder, torch::Device device, torch::ScalarType dtype) {
  const auto config = DcAeConfig::from_json(read_hf_config(folder), folder + "/config.json");
  const std::string stem = "diffusion_pytorch_model";
  if (!holds_hf_weights(folder, stem)) {
    throw WeightsError(fmt::format("{}: no {}.safetensors (nor its index); AutoencoderDC's folder holds its weights "
                                   "as safetensors",
                                   folder, stem));
  }
  return from_tensors(read_hf_weights(folder, stem), config, folder + " (its config.json)", device, dtype);
}

DcAe DcAe::load_efficientvit(const std::string& folder, const std::string& name, torch::Device device,
                             torch::ScalarType dtype) {
  DcAeConfig config;
  if (!DcAeConfig::for_efficientvit(name, config)) {
    throw WeightsError(fmt::format("{}: '{}' is not a DC-AE whose efficientvit layout is read here ({}); give its "
                                   "diffusers folder ({}-diffusers)",
                                   folder, name, fmt::join(efficientvit_names(), ", "), name));
  }
  return load_efficientvit(folder, config, device, dtype);
}

DcAe DcAe::load_efficientvit(const std::string& folder, const DcAeConfig& config, torch::Device device,
                             torch::ScalarType dtype) {
  if (!holds_hf_weights(folder, "model")) {
    throw WeightsError(fmt::format("{}: no model.safetensors, where efficientvit's DC-AE keeps its weights", folder));
  }
  return from_tensors(diffusers_names(read_hf_weights(folder, "model")), config,
                      folder + " (efficientvit's layout)", device, dtype);
}

DcAe DcAe::from_tensors(std::map<std::string, torch::Tensor> tensors, const DcAeConfig& config,
                        const std::string& where, torch::Device device, torch::ScalarType dtype) {
  DcAe m;
  m.cfg_ = config;
  m.device_ = device;
  m.dtype_ = dtype;
  std::vector<std::string> problems;
  for (const auto& [name, shape] : tensor_shapes(m.cfg_)) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      problems.push_back(fmt::format("{} missing", name));
    } else if (it->second.sizes() != at::IntArrayRef(shape)) {
      problems.push_back(fmt::format("{} is {}, the config makes it {}", name, it->second.sizes(), at::IntArrayRef(shape)));
    } else {
      m.w_[name] = it->second.to(device, dtype).contiguous();  // BatchNorm's statistics too, as diffusers casts them
    }
    if (it != tensors.end()) tensors.erase(it);
  }
  for (const auto& [name, t] : tensors) {
    if (name.size() < 20 || name.compare(name.size() - 20, 20, ".num_batches_tracked") != 0) {
      problems.push_back(fmt::format("{} unexpected", name));
    }
  }
  if (!problems.empty()) {
    throw WeightsError(fmt::format("{}: the weights do not make the AutoencoderDC it describes:{}", where,
                                   problem_list(problems)));
  }
  return m;
}

int64_t DcAe::parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : w_) {
    if (name.find("running_") == std::string::npos) n += t.numel();
  }
  return n;
}

int64_t DcAe::bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : w_) n += static_cast<int64_t>(t.nbytes());
  return n;
}

const torch::Tensor& DcAe::w(const std::string& name) const {
  const auto it = w_.find(name);
  if (it == w_.end()) throw std::logic_error("DcAe: no tensor " + name);  // tensor_shapes and the forward disagree
  return it->second;
}

torch::Tensor DcAe::norm(const std::string& p, const std::string& type, const torch::Tensor& x) const {
  if (type == "batch_norm") {
    return torch::batch_norm(x, w(p + "weight"), w(p + "bias"), w(p + "running_mean"), w(p + "running_var"), false,
                             0.0, kNormEps, true);
  }
  // diffusers' RMSNorm over the channels: the mean square in fp32, the product in the
  // promoted type, then the weights' type when they are half, times weight plus bias.
  const auto c = x.movedim(1, -1);
  const auto& weight = w(p + "weight");
  auto y = c * torch::rsqrt(c.to(torch::kFloat32).pow(2).mean(-1, true) + kNormEps);
  if (weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kFloat16) {
    // diffusers' two roundings, the product's and the sum's.
    return (y.to(weight.scalar_type()) * weight + w(p + "bias")).movedim(-1, 1);
  }
  return torch::addcmul(w(p + "bias"), y, weight).movedim(-1, 1);  // fp32: one pass for the product and the bias
}

torch::Tensor DcAe::res_block(const std::string& p, const std::string& norm_type, const std::string& act,
                              const torch::Tensor& x) const {
  auto h = conv(x, w(p + "conv1.weight"), w(p + "conv1.bias"), 1, 1);
  h = conv(activation(act, h), w(p + "conv2.weight"), {}, 1, 1);
  return norm(p + "norm.", norm_type, h) + x;
}

torch::Tensor DcAe::attention(const std::string& p, const std::string& norm_type, size_t scales,
                              const torch::Tensor& x) const {
  const int64_t B = x.size(0), H = x.size(2), W = x.size(3), d = cfg_.head_dim;
  const auto dtype = x.scalar_type();
  const auto tokens = x.movedim(1, -1);
  const auto qkv = torch::cat({torch::linear(tokens, w(p + "to_q.weight")), torch::linear(tokens, w(p + "to_k.weight")),
                               torch::linear(tokens, w(p + "to_v.weight"))},
                              3)
                       .movedim(-1, 1);
  std::vector<torch::Tensor> multi = {qkv};
  const int64_t channels = qkv.size(1), heads = channels / (3 * d);
  for (size_t k = 0; k < scales; ++k) {
    const auto q = fmt::format("{}to_qkv_multiscale.{}.", p, k);
    const auto& in = w(q + "proj_in.weight");
    const auto spread = conv(qkv, in, {}, 1, in.size(2) / 2, channels);
    multi.push_back(conv(spread, w(q + "proj_out.weight"), {}, 1, 0, 3 * heads));
  }
  const bool linear = H * W > d;  // diffusers: quadratic attention on maps no larger than a head
  auto h = torch::cat(multi, 1);
  if (linear) h = h.to(torch::kFloat32);
  h = h.reshape({B, -1, 3 * d, H * W});
  const auto parts = h.chunk(3, 2);
  const auto q = torch::relu(parts[0]), k = torch::relu(parts[1]);
  const auto& v = parts[2];
  torch::Tensor out;
  if (linear) {
    const auto v1 = torch::constant_pad_nd(v, {0, 0, 0, 1}, 1.0);  // a row of ones: the normaliser
    const auto sums = torch::matmul(torch::matmul(v1, k.transpose(-1, -2)), q).to(torch::kFloat32);
    out = (sums.narrow(2, 0, d) / (sums.narrow(2, d, 1) + kAttentionEps)).to(dtype);
  } else {
    auto scores = torch::matmul(k.transpose(-1, -2), q).to(torch::kFloat32);
    scores = scores / (scores.sum(2, true) + kAttentionEps);
    out = torch::matmul(v, scores.to(v.scalar_type()));
  }
  out = torch::linear(out.reshape({B, -1, H, W}).movedim(1, -1), w(p + "to_out.weight")).movedim(-1, 1);
  return norm(p + "norm_out.", norm_type, out) + x;
}

torch::Tensor DcAe::vit_block(const std::string& p, const std::string& norm_type, size_t scales,
                              const torch::Tensor& x) const {
  const auto a = attention(p + "attn.", norm_type, scales, x);
  const auto g = p + "conv_out.";
  auto h = torch::silu(conv(a, w(g + "conv_inverted.weight"), w(g + "conv_inverted.bias"), 1, 0));
  h = conv(h, w(g + "conv_depth.weight"), w(g + "conv_depth.bias"), 1, 1, h.size(1));
  const auto halves = h.chunk(2, 1);
  h = conv(halves[0] * torch::silu(halves[1]), w(g + "conv_point.weight"), {}, 1, 0);
  return norm(g + "norm.", "rms_norm", h) + a;
}

torch::Tensor DcAe::encode(const torch::Tensor& images) const {
  c10::InferenceMode inference;
  const auto& e = cfg_.encoder;
  const size_t n = e.channels.size();
  auto h = images.to(device_, dtype_);
  // The down sampler: a stride-2 conv, or a conv then pixel-unshuffle; the shortcut averages
  // the unshuffled input's channel groups.
  const auto down = [&](const std::string& p, const torch::Tensor& x, bool shortcut) {
    auto y = conv(x, w(p + "conv.weight"), w(p + "conv.bias"), cfg_.pixel_unshuffle ? 1 : 2, 1);
    if (cfg_.pixel_unshuffle) y = torch::pixel_unshuffle(y, 2);
    if (!shortcut) return y;
    const int64_t group = x.size(1) * 4 / y.size(1);
    return y + torch::pixel_unshuffle(x, 2).unflatten(1, {-1, group}).mean(2);
  };
  h = e.layers[0] > 0 ? conv(h, w("encoder.conv_in.weight"), w("encoder.conv_in.bias"), 1, 1)
                      : down("encoder.conv_in.", h, false);
  for (size_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < e.layers[i]; ++j) {
      const auto p = fmt::format("encoder.down_blocks.{}.{}.", i, j);
      h = e.block_types[i] == "ResBlock" ? res_block(p, e.norms[i], e.acts[i], h)
                                         : vit_block(p, e.norms[i], e.scales[i].size(), h);
    }
    if (i + 1 < n && e.layers[i] > 0) h = down(fmt::format("encoder.down_blocks.{}.{}.", i, e.layers[i]), h, true);
  }
  auto out = conv(h, w("encoder.conv_out.weight"), w("encoder.conv_out.bias"), 1, 1);
  if (cfg_.encoder_out_shortcut) out = out + h.unflatten(1, {-1, h.size(1) / cfg_.latent_channels}).mean(2);
  return out;
}

torch::Tensor DcAe::decode(const torch::Tensor& latents) const {
  c10::InferenceMode inference;
  const auto& d = cfg_.decoder;
  const size_t m = d.channels.size();
  const auto z = latents.to(device_, dtype_);
  // The up sampler: nearest x2 then a conv, or a conv then pixel-shuffle; the shortcut
  // repeats the input's channels and pixel-shuffles them.
  const auto up = [&](const std::string& p, const torch::Tensor& x, bool shortcut) {
    torch::Tensor y;
    if (cfg_.interpolate) {
      const auto wide = F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0})
                                              .mode(torch::kNearest));
      y = conv(wide, w(p + "conv.weight"), w(p + "conv.bias"), 1, 1);
    } else {
      y = torch::pixel_shuffle(conv(x, w(p + "conv.weight"), w(p + "conv.bias"), 1, 1), 2);
    }
    if (!shortcut) return y;
    const int64_t repeats = y.size(1) * 4 / x.size(1);
    return y + torch::pixel_shuffle(x.repeat_interleave(repeats, 1), 2);
  };
  auto h = conv(z, w("decoder.conv_in.weight"), w("decoder.conv_in.bias"), 1, 1);
  if (cfg_.decoder_in_shortcut) h = h + z.repeat_interleave(h.size(1) / cfg_.latent_channels, 1);
  for (size_t i = m; i-- > 0;) {
    int64_t j0 = 0;
    if (i + 1 < m && d.layers[i] > 0) {
      h = up(fmt::format("decoder.up_blocks.{}.0.", i), h, true);
      j0 = 1;
    }
    for (int64_t j = 0; j < d.layers[i]; ++j) {
      const auto p = fmt::format("decoder.up_blocks.{}.{}.", i, j0 + j);
      h = d.block_types[i] == "ResBlock" ? res_block(p, d.norms[i], d.acts[i], h)
                                         : vit_block(p, d.norms[i], d.scales[i].size(), h);
    }
  }
  h = activation(cfg_.decoder_conv_act, norm("decoder.norm_out.", "rms_norm", h));
  return d.layers[0] > 0 ? conv(h, w("decoder.conv_out.weight"), w("decoder.conv_out.bias"), 1, 1)
                         : up("decoder.conv_out.", h, false);
}

}  // namespace sana::model
