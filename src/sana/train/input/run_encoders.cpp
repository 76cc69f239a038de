#include "sana/train/input/run_encoders.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sana/data/sample_cache.h"
#include "sana/model/dc_ae.h"
#include "sana/model/gemma2.h"
#include "sana/model/hf_weights.h"
#include "sana/model/weights.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

bool wants_vae(const EncoderOptions& o, EncoderUse use) {
  return o.vae && !(use == EncoderUse::training && o.precomputed_latents);
}

bool wants_text(const EncoderOptions& o, EncoderUse use, model::Conditioning conditioning) {
  return o.text && (use == EncoderUse::training ? !o.precomputed_captions
                                                : conditioning == model::Conditioning::caption && o.validation_prompts);
}

// A native encoder of `parameters` (counted by `count` from its folder's config.json).
template <class Count>
EncoderWeights native(std::string role, std::string what, const std::string& folder, bool cuda, Count count) {
  const auto dtype = model::native_encoder_dtype(cuda);
  EncoderWeights w{std::move(role), std::move(what), folder, -1, 0, dtype == torch::kBFloat16 ? "bf16" : "fp32", ""};
  try {
    const auto elements = count();
    w.parameters = elements.first;
    w.bytes = elements.second * static_cast<int64_t>(c10::elementSize(dtype));
  } catch (const std::exception& e) {
    w.missing = e.what();
  }
  return w;
}

EncoderWeights exported(std::string role, const std::string& file) {
  EncoderWeights w{std::move(role), "TorchScript export", file, -1, 0, "", ""};
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) {
    w.missing = fmt::format("'{}' is not on this machine (a run names where it looked and what to download)", file);
  } else {
    w.bytes = static_cast<int64_t>(size);
  }
  return w;
}

}  // namespace

Encoders load_encoders(const EncoderOptions& o, torch::Device device, EncoderUse use, model::Conditioning conditioning) {
  Encoders e;
  using Clock = std::chrono::steady_clock;
  const auto loaded = [&](const char* role, const std::string& what, const std::string& from, int64_t bytes,
                          Clock::time_point since) {
    log::info("{}: {} from {}: {} on {}, loaded in {:.1f} s", role, what, from,
              data::size_text(static_cast<uint64_t>(bytes)), device.str(),
              std::chrono::duration<double>(Clock::now() - since).count());
  };
  if (wants_vae(o, use)) {
    const auto took = Clock::now();
    e.vae = std::make_shared<model::FrozenVae>(model::FrozenVae::load(*o.vae, device));
    loaded("VAE", o.vae->dc_ae_folder               ? "DC-AE (diffusers' AutoencoderDC folder)"
                  : !o.vae->efficientvit_name.empty() ? "DC-AE " + o.vae->efficientvit_name + " (efficientvit's folder)"
                                                      : std::string("TorchScript export"),
           o.vae->vae_pretrained, e.vae->bytes(), took);
  }
  if (wants_text(o, use, conditioning)) {
    const auto took = Clock::now();
    e.text = std::make_shared<model::FrozenTextEncoder>(model::FrozenTextEncoder::load(*o.text, device));
    loaded("text encoder", o.text->gemma2_folder ? "Gemma-2 (transformers' folder)" : "TorchScript export",
           o.text->text_encoder_path, e.text->bytes(), took);
  }
  if (!o.hed_model.empty()) e.hed = model::FrozenHed::load(o.hed_model);
  return e;
}

std::vector<EncoderWeights> encoder_weights(const EncoderOptions& o, bool cuda, EncoderUse use,
                                            model::Conditioning conditioning) {
  std::vector<EncoderWeights> out;
  if (wants_vae(o, use)) {
    const auto& v = *o.vae;
    if (v.dc_ae_folder || !v.efficientvit_name.empty()) {
      out.push_back(native("VAE", "DC-AE", v.vae_pretrained, cuda, [&] {
        model::DcAeConfig c;
        if (v.dc_ae_folder) {
          c = model::DcAeConfig::from_json(model::read_hf_config(v.vae_pretrained), v.vae_pretrained + "/config.json");
        } else if (!model::DcAeConfig::for_efficientvit(v.efficientvit_name, c)) {
          throw std::logic_error("encoder_weights: no DC-AE named " + v.efficientvit_name);
        }
        return std::make_pair(c.parameters(), c.elements());
      }));
    } else {
      out.push_back(exported("VAE", v.vae_pretrained));
    }
  }
  if (wants_text(o, use, conditioning)) {
    const auto& t = *o.text;
    if (t.gemma2_folder) {
      out.push_back(native("text encoder", "Gemma-2", t.text_encoder_path, cuda, [&] {
        const auto n = model::Gemma2Config::from_json(model::read_hf_config(t.text_encoder_path),
                                                      t.text_encoder_path + "/config.json")
                           .parameters();
        return std::make_pair(n, n);
      }));
    } else {
      out.push_back(exported("text encoder", t.text_encoder_path.empty() ? t.text_encoder_name : t.text_encoder_path));
    }
  }
  return out;
}

int64_t total_bytes(const std::vector<EncoderWeights>& encoders) {
  int64_t n = 0;
  for (const auto& e : encoders) n += e.bytes;
  return n;
}

data::ControlMapOptions control_maps_for(data::ControlMapOptions o, const Encoders& encoders) {
  if (o.kind != data::ControlKind::scribble && o.kind != data::ControlKind::hed) return o;
  if (!encoders.hed) throw std::logic_error("control_maps_for: the HED network was not loaded");
  o.edges = [hed = encoders.hed](const cv::Mat& image) {
    const cv::Mat rgb = image.isContinuous() ? image : image.clone();
    const auto edges = hed->edges(torch::from_blob(const_cast<uchar*>(rgb.ptr<uchar>()), {rgb.rows, rgb.cols, 3},
                                                   torch::kUInt8));
    cv::Mat out(rgb.rows, rgb.cols, CV_8U);
    std::memcpy(out.data, edges.data_ptr<uint8_t>(), static_cast<size_t>(rgb.rows) * static_cast<size_t>(rgb.cols));
    return out;
  };
  return o;
}

bool use_empty_prompt(model::SanaMS& model, const Encoders& encoders, const std::string& null_embed_file) {
  if (!model->caption_embedder) return false;
  torch::NoGradGuard no_grad;
  auto& null_caption = model->caption_embedder->y_embedding;
  if (encoders.text) {
    null_caption.copy_(encoders.text->empty_prompt().to(null_caption.device(), null_caption.scalar_type()));
    log::info("y_embedder.y_embedding: the text encoder's empty-prompt features, as upstream sets it on loading");
    return true;
  }
  if (null_embed_file.empty()) {
    log::info("y_embedder.y_embedding stays the loaded one: no text encoder, and no null embedding "
              "(text_encoder.null_embed_path, or upstream's file under train.null_embed_root)");
    return false;
  }
  const auto tensors = model::read_state_dict(null_embed_file);
  const auto it = tensors.find("uncond_prompt_embeds");
  if (it == tensors.end()) {
    throw UsageError(fmt::format("text_encoder.null_embed_path: '{}' has no tensor 'uncond_prompt_embeds' (the "
                                 "layout upstream's train.py writes)", null_embed_file), "config error");
  }
  torch::Tensor null = it->second;
  if (null.dim() == 3 && null.size(0) == 1) null = null[0];
  if (null.sizes() != null_caption.sizes()) {
    throw UsageError(fmt::format("text_encoder.null_embed_path: '{}' holds {} features, the model's null caption "
                                 "is {} (text_encoder.model_max_length x caption_channels)",
                                 null_embed_file, fmt::join(null.sizes(), "x"), fmt::join(null_caption.sizes(), "x")),
                     "config error");
  }
  null_caption.copy_(null.to(null_caption.device(), null_caption.scalar_type()));
  log::info("y_embedder.y_embedding: the empty prompt's features from '{}', as upstream's load_checkpoint",
            null_embed_file);
  return true;
}

}  // namespace sana::train
