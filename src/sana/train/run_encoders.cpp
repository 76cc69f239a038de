#include "sana/train/run_encoders.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sana/model/weights.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

Encoders load_encoders(const EncoderOptions& o, torch::Device device, EncoderUse use, model::Conditioning conditioning) {
  const bool training = use == EncoderUse::training;
  Encoders e;
  if (o.vae && !(training && o.precomputed_latents)) {
    e.vae = std::make_shared<model::FrozenVae>(model::FrozenVae::load(*o.vae, device));
  }
  const bool wanted = training ? !o.precomputed_captions
                               : conditioning == model::Conditioning::caption && o.validation_prompts;
  if (o.text && wanted) e.text = std::make_shared<model::FrozenTextEncoder>(model::FrozenTextEncoder::load(*o.text, device));
  if (!o.hed_model.empty()) e.hed = model::FrozenHed::load(o.hed_model);
  return e;
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
