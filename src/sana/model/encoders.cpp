#include "sana/model/encoders.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "sana/model/weights.h"
#include "sana/util/log.h"

namespace sana::model {

namespace {

torch::jit::Module load_frozen(const std::string& path, const char* key, torch::Device device) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, device);
  } catch (const std::exception& e) {
    throw EncoderError(fmt::format("{}: cannot load '{}' as TorchScript ({}); export it with "
                                   "torch.jit.script(module).save(path)",
                                   key, path, std::string(e.what()).substr(0, 300)));
  }
  m.eval();
  for (auto p : m.parameters()) p.set_requires_grad(false);
  return m;
}

std::string shape(const torch::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

// A VAE that carries its own scaling factor must agree with vae.scale_factor.
void check_scaling_factor(const VaeOptions& cfg, double f) {
  if (std::abs(f - cfg.scale_factor) > 1e-6 * std::abs(f)) {
    throw EncoderError(fmt::format(
        "vae.scale_factor is {}, but the VAE '{}' carries its own scaling_factor {} (upstream scales latents by "
        "the VAE's own factor and never reads vae.scale_factor); set vae.scale_factor: {}",
        cfg.scale_factor, cfg.vae_pretrained, f, f));
  }
}

// A TorchScript module's parameters and buffers, each tensor once.
int64_t module_bytes(const torch::jit::Module& m) {
  int64_t n = 0;
  for (const auto& t : m.parameters(/*recurse=*/true)) n += static_cast<int64_t>(t.nbytes());
  for (const auto& t : m.buffers(/*recurse=*/true)) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace

torch::ScalarType native_encoder_dtype(bool cuda) { return cuda ? torch::kBFloat16 : torch::kFloat32; }

int64_t FrozenVae::bytes() const { return dc_ae_ ? dc_ae_->bytes() : module_bytes(module_); }

int64_t FrozenTextEncoder::bytes() const { return gemma_ ? gemma_->bytes() : module_bytes(module_); }

FrozenVae FrozenVae::load(const VaeOptions& cfg, torch::Device device, int64_t probe_size) {
  FrozenVae vae;
  vae.cfg_ = cfg;
  vae.device_ = device;
  if (cfg.dc_ae_folder || !cfg.efficientvit_name.empty()) {
    const auto dtype = native_encoder_dtype(device.is_cuda());
    try {
      vae.dc_ae_ = std::make_shared<const DcAe>(
          cfg.dc_ae_folder ? DcAe::load(cfg.vae_pretrained, device, dtype)
                           : DcAe::load_efficientvit(cfg.vae_pretrained, cfg.efficientvit_name, device, dtype));
    } catch (const WeightsError& e) {
      throw EncoderError(fmt::format("vae.vae_pretrained: {}", e.what()));
    }
    vae.can_decode_ = true;
    // Upstream scales latents by the folder's own scaling_factor (ae.config.scaling_factor).
    check_scaling_factor(cfg, vae.dc_ae_->config().scaling_factor);
  } else {
    vae.load_torchscript(cfg);
  }
  const int64_t side = std::max(probe_size, cfg.vae_downsample_rate);
  const auto latents = vae.encode(torch::zeros({1, 3, side, side}));
  (void)latents;
  return vae;
}

void FrozenVae::load_torchscript(const VaeOptions& cfg) {
  module_ = load_frozen(cfg.vae_pretrained, "vae.vae_pretrained", device_);
  if (!module_.find_method("encode")) {
    throw EncoderError(fmt::format("vae.vae_pretrained: '{}' has no method encode(images); export a module "
                                   "whose encode() returns latents",
                                   cfg.vae_pretrained));
  }
  can_decode_ = module_.find_method("decode").has_value();
  // Upstream scales DC-AE latents by the VAE's own factor (ae.cfg.scaling_factor) and never
  // reads vae.scale_factor: an export that carries its factor must agree with the config.
  if (module_.hasattr("scaling_factor")) {
    const c10::IValue own = module_.attr("scaling_factor");
    if (!own.isDouble()) {
      throw EncoderError(fmt::format("vae.vae_pretrained: '{}' has a scaling_factor attribute that is not a float",
                                     cfg.vae_pretrained));
    }
    check_scaling_factor(cfg, own.toDouble());
  }
}

torch::Tensor FrozenVae::encode(const torch::Tensor& images) {
  const int64_t tile = cfg_.tile_size;
  const bool tiled = tile > 0 && images.dim() == 4 && (images.size(2) > tile || images.size(3) > tile);
  return tiled ? encode_tiled(images) : encode_whole(images);
}

namespace {

// Where the tiles of one axis start: every `stride` pixels, the last moved back to end at the edge.
std::vector<int64_t> tile_starts(int64_t length, int64_t tile, int64_t stride) {
  std::vector<int64_t> out;
  for (int64_t p = 0;; p += stride) {
    if (p + tile >= length) {
      out.push_back(std::max<int64_t>(0, length - tile));
      break;
    }
    out.push_back(p);
  }
  return out;
}

// A tile's weights along one axis, `cells` latent cells from `begin` to `end` of an axis of
// `length` cells: rising over `ramp` cells from each edge another tile overlaps, flat at
// the image's border.
torch::Tensor tile_ramp(int64_t cells, int64_t begin, int64_t length, int64_t ramp) {
  auto w = torch::ones({cells}, torch::kFloat32);
  if (ramp <= 0) return w;
  const auto i = torch::arange(cells, torch::kFloat32) + 0.5;
  if (begin > 0) w = torch::minimum(w, i / static_cast<double>(ramp));
  if (begin + cells < length) w = torch::minimum(w, (static_cast<double>(cells) - i) / static_cast<double>(ramp));
  return w;
}

}  // namespace

torch::Tensor FrozenVae::encode_tiled(const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  const int64_t f = cfg_.vae_downsample_rate, H = images.size(2), W = images.size(3);
  const int64_t th = std::min(cfg_.tile_size, H), tw = std::min(cfg_.tile_size, W);
  const int64_t stride = cfg_.tile_size - cfg_.tile_overlap, ramp = cfg_.tile_overlap / f;
  torch::Tensor sum, weights;
  for (const int64_t y : tile_starts(H, th, stride)) {
    for (const int64_t x : tile_starts(W, tw, stride)) {
      const auto z = encode_whole(images.narrow(2, y, th).narrow(3, x, tw));
      if (!sum.defined()) {
        sum = torch::zeros({z.size(0), z.size(1), H / f, W / f}, z.options());
        weights = torch::zeros({1, 1, H / f, W / f}, z.options());
      }
      const auto w = (tile_ramp(th / f, y / f, H / f, ramp).unsqueeze(1) * tile_ramp(tw / f, x / f, W / f, ramp).unsqueeze(0))
                         .to(z.device())
                         .view({1, 1, th / f, tw / f});
      sum.narrow(2, y / f, th / f).narrow(3, x / f, tw / f).add_(z * w);
      weights.narrow(2, y / f, th / f).narrow(3, x / f, tw / f).add_(w);
    }
  }
  return sum / weights;
}

torch::Tensor FrozenVae::encode_whole(const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  torch::Tensor z;
  try {
    z = dc_ae_ ? dc_ae_->encode(images) : module_.get_method("encode")({images.to(device_)}).toTensor();
  } catch (const std::exception& e) {
    throw EncoderError(fmt::format("vae.vae_pretrained: encode() failed on images {}: {}", shape(images),
                                   std::string(e.what()).substr(0, 300)));
  }
  const int64_t f = cfg_.vae_downsample_rate;
  if (z.dim() != 4 || z.size(0) != images.size(0) || z.size(1) != cfg_.vae_latent_dim ||
      z.size(2) * f != images.size(2) || z.size(3) * f != images.size(3)) {
    throw EncoderError(fmt::format(
        "vae.vae_pretrained: encode() turned images {} into {}, but the config expects [{}, {}, {}, {}] "
        "(vae.vae_latent_dim {}, vae.vae_downsample_rate {})",
        shape(images), shape(z), images.size(0), cfg_.vae_latent_dim, images.size(2) / f, images.size(3) / f,
        cfg_.vae_latent_dim, f));
  }
  return z.to(torch::kFloat32) * cfg_.scale_factor;
}

torch::Tensor FrozenVae::decode(const torch::Tensor& latents) {
  if (!can_decode_) throw EncoderError("vae.vae_pretrained has no decode() method");
  torch::NoGradGuard no_grad;
  const auto z = (latents / cfg_.scale_factor).to(device_);
  return (dc_ae_ ? dc_ae_->decode(z) : module_.get_method("decode")({z}).toTensor()).to(torch::kFloat32);
}

struct CaptionCache {
  struct Entry {
    torch::Tensor features, mask;  // [1, L, C] (fp32, or bf16 when that is what the encoder gave), [1, L]
  };
  std::mutex mutex;
  std::unordered_map<std::string, Entry> entries;
  int64_t budget = 0, bytes = 0, hits = 0, misses = 0;
  bool full = false;
};

FrozenTextEncoder FrozenTextEncoder::load(const TextEncoderOptions& cfg, torch::Device device) {
  FrozenTextEncoder enc;
  enc.cfg_ = cfg;
  enc.device_ = device;
  if (cfg.gemma2_folder) {
    const auto dtype = native_encoder_dtype(device.is_cuda());
    try {
      enc.gemma_ = std::make_shared<const Gemma2>(Gemma2::load(cfg.text_encoder_path, device, dtype));
    } catch (const WeightsError& e) {
      throw EncoderError(fmt::format("text_encoder.text_encoder_path: {}", e.what()));
    }
    if (cfg.tokenizer_path.empty()) throw EncoderError("text_encoder.tokenizer_path: a Gemma-2 folder needs its tokenizer.model");
  } else {
    enc.module_ = load_frozen(cfg.text_encoder_path, "text_encoder.text_encoder_path", device);
  }
  if (!cfg.tokenizer_path.empty()) {
    enc.tokenizer_ = std::make_shared<CaptionTokenizer>(cfg.tokenizer_path, cfg.text_encoder_name);
  }
  enc.cache_ = std::make_shared<CaptionCache>();
  enc.cache_->budget = cfg.caption_cache_bytes;
  (void)enc.encode_one("a probe prompt");
  return enc;
}

std::pair<torch::Tensor, torch::Tensor> FrozenTextEncoder::run(const std::vector<std::string>& texts, int64_t length) {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(texts.size());
  std::vector<c10::IValue> inputs;
  torch::Tensor mask;
  if (tokenizer_) {
    const auto tokens = tokenizer_->batch(texts, length);
    mask = torch::tensor(tokens.mask, torch::kInt64).view({n, length});
    inputs = {torch::tensor(tokens.ids, torch::kInt64).view({n, length}).to(device_), mask.to(device_)};
  } else {
    c10::List<std::string> list;
    for (const auto& t : texts) list.push_back(t);
    inputs = {list};
  }
  if (gemma_) return {gemma_->forward(inputs[0].toTensor(), inputs[1].toTensor()).to(torch::kFloat32), mask};
  c10::IValue out;
  try {
    out = module_.forward(inputs);
  } catch (const std::exception& e) {
    throw EncoderError(fmt::format("text_encoder.text_encoder_path: forward({}) failed: {}",
                                   tokenizer_ ? "input_ids, attention_mask" : "prompts",
                                   std::string(e.what()).substr(0, 300)));
  }
  const bool tuple = out.isTuple() && !out.toTupleRef().elements().empty();
  const c10::IValue first = tuple ? out.toTupleRef().elements()[0] : out;
  if (tokenizer_ && first.isTensor()) return {first.toTensor().to(torch::kFloat32), mask};
  if (!tokenizer_ && tuple && out.toTupleRef().elements().size() == 2 && first.isTensor() &&
      out.toTupleRef().elements()[1].isTensor()) {
    return {first.toTensor().to(torch::kFloat32), out.toTupleRef().elements()[1].toTensor().to(torch::kInt64)};
  }
  throw EncoderError(tokenizer_ ? "text_encoder.text_encoder_path: forward(input_ids, attention_mask) must return "
                                  "features (or a tuple that starts with them)"
                                : "text_encoder.text_encoder_path: forward(prompts) must return (features, mask)");
}


std::pair<torch::Tensor, torch::Tensor> FrozenTextEncoder::encode_one(const std::string& prompt) {
  const auto count = [this](const std::string& text) {
    return tokenizer_ ? static_cast<int64_t>(tokenizer_->encode(text).size()) : int64_t{0};
  };
  const int64_t L = cfg_.model_max_length;
  const auto plan = plan_captions({prompt}, cfg_.chi_prompt, cfg_.text_encoder_name, L, count);
  auto [features, mask] = run(plan.texts, plan.length);
  // Without a tokenizer the module chose the length: keep token 0 and the last L - 1 of it.
  const auto keep = tokenizer_ ? plan.keep : select_index(features.dim() == 3 ? features.size(1) : 0, L);
  if (features.dim() == 3 && mask.dim() == 2 && features.size(1) >= L && mask.size(1) == features.size(1)) {
    const auto index = torch::tensor(keep, torch::kInt64).to(features.device());
    features = features.index_select(1, index);
    mask = mask.to(features.device()).index_select(1, index);
  }
  return checked({features, mask}, 1);
}

std::pair<torch::Tensor, torch::Tensor> FrozenTextEncoder::encode(const std::vector<std::string>& prompts) {
  auto& cache = *cache_;
  // Gemma-2 in bf16 (on CUDA) gives bf16 values: kept as bf16, they come back exactly.
  const auto kept = gemma_ && device_.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  if (prompts.empty()) {
    const auto opts = torch::TensorOptions().device(device_);
    return {torch::zeros({0, cfg_.model_max_length, cfg_.caption_channels}, opts),
            torch::zeros({0, cfg_.model_max_length}, opts.dtype(torch::kInt64))};
  }
  std::vector<torch::Tensor> features, masks;
  for (const auto& prompt : prompts) {
    {
      std::lock_guard<std::mutex> lock(cache.mutex);
      const auto it = cache.entries.find(prompt);
      if (it != cache.entries.end()) {
        ++cache.hits;
        features.push_back(it->second.features.to(device_, torch::kFloat32));
        masks.push_back(it->second.mask.to(device_));
        continue;
      }
    }
    auto [f, m] = encode_one(prompt);
    features.push_back(f);
    masks.push_back(m);
    std::lock_guard<std::mutex> lock(cache.mutex);
    ++cache.misses;
    if (cache.full || cache.entries.count(prompt) != 0) continue;
    CaptionCache::Entry e{f.to(torch::kCPU, kept), m.to(torch::kCPU)};
    const auto size = static_cast<int64_t>(e.features.nbytes() + e.mask.nbytes() + prompt.size());
    if (cache.bytes + size > cache.budget) {
      cache.full = cache.budget > 0;
      if (cache.full) {
        log::info("text_encoder.caption_cache_gib ({:.1f} MiB) is full at {} captions; others are encoded each time "
                  "they come (raise it, or write the features once with sana-train prepare-features)",
                  static_cast<double>(cache.budget) / (1 << 20), cache.entries.size());
      }
      continue;
    }
    cache.bytes += size;
    cache.entries.emplace(prompt, std::move(e));
  }
  return {torch::cat(features, 0), torch::cat(masks, 0)};
}

FrozenTextEncoder::CacheStats FrozenTextEncoder::cache_stats() const {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  return {cache_->hits, cache_->misses, static_cast<int64_t>(cache_->entries.size()), cache_->bytes, cache_->full};
}

torch::Tensor FrozenTextEncoder::empty_prompt() {
  return checked(run({""}, cfg_.model_max_length), 1).first[0];
}

std::pair<torch::Tensor, torch::Tensor> FrozenTextEncoder::checked(std::pair<torch::Tensor, torch::Tensor> out,
                                                                   int64_t n) const {
  const auto& [features, mask] = out;
  if (features.dim() != 3 || features.size(0) != n || features.size(1) != cfg_.model_max_length ||
      features.size(2) != cfg_.caption_channels || mask.sizes() != features.sizes().slice(0, 2)) {
    throw EncoderError(fmt::format(
        "text_encoder.text_encoder_path: forward() gave features {} and mask {} for {} prompts; the config "
        "expects [{}, {}, {}] and [{}, {}] (text_encoder.model_max_length {}, text_encoder.caption_channels {})",
        shape(features), shape(mask), n, n, cfg_.model_max_length, cfg_.caption_channels, n,
        cfg_.model_max_length, cfg_.model_max_length, cfg_.caption_channels));
  }
  return {features, mask.to(torch::kInt64)};
}

std::shared_ptr<FrozenHed> FrozenHed::load(const std::string& path) {
  auto hed = std::make_shared<FrozenHed>();
  hed->path_ = path;
  hed->module_ = load_frozen(path, "controlnet.hed_model", torch::kCPU);
  (void)hed->edges(torch::zeros({64, 64, 3}, torch::kUInt8));
  return hed;
}

torch::Tensor FrozenHed::edges(const torch::Tensor& rgb) {
  const int64_t h = rgb.size(0), w = rgb.size(1);
  std::lock_guard<std::mutex> lock(mutex_);
  c10::InferenceMode inference;
  const auto x = rgb.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32);
  const auto out = module_.forward({x});
  std::vector<torch::Tensor> sides;
  if (out.isTuple()) {
    for (const auto& v : out.toTupleRef().elements()) sides.push_back(v.toTensor());
  } else if (out.isList()) {
    for (const auto& v : out.toList()) sides.push_back(v.get().toTensor());
  }
  if (sides.empty() || sides.front().dim() != 4 || sides.front().size(1) != 1) {
    throw EncoderError(fmt::format("controlnet.hed_model: '{}' does not return HED's side outputs (a tuple of "
                                   "[1, 1, h, w] maps); export it with scripts/export_hed.py",
                                   path_));
  }
  auto sum = torch::zeros({1, 1, h, w}, torch::kFloat64);
  for (const auto& side : sides) {
    sum += torch::nn::functional::interpolate(
               side.to(torch::kFloat32),
               torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false))
               .to(torch::kFloat64);
  }
  const auto edge = torch::sigmoid(sum / static_cast<double>(sides.size()));
  return (edge * 255.0).clamp(0, 255).to(torch::kUInt8)[0][0].contiguous();
}

}  // namespace sana::model
