#include "sana/train/run_encoders.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sana/model/weights.h"
#include "sana/train/component_options.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

Encoders load_encoders(const config::Config& cfg, torch::Device device, EncoderUse use,
                       model::Conditioning conditioning) {
  const bool training = use == EncoderUse::training;
  Encoders e;
  if (config::uses_vae(cfg.vae) && !(training && cfg.data.load_vae_feat)) {
    e.vae = std::make_shared<model::FrozenVae>(model::FrozenVae::load(vae_options_for(cfg), device));
  }
  const bool wanted = training ? !cfg.data.load_text_feat
                               : conditioning == model::Conditioning::caption && !cfg.train.validation_prompts.empty();
  if (config::uses_text_encoder(cfg.text_encoder) && wanted) {
    e.text = std::make_shared<model::FrozenTextEncoder>(model::FrozenTextEncoder::load(text_encoder_options_for(cfg), device));
  }
  const auto signal = cfg.controlnet.control_signal_type;
  if ((signal == config::ControlSignal::scribble || signal == config::ControlSignal::hed) &&
      !cfg.controlnet.hed_model.empty() && model_spec_for(cfg).control_blocks > 0) {
    e.hed = model::FrozenHed::load(cfg.controlnet.hed_model);
  }
  return e;
}

data::ControlMapOptions control_maps_for(const config::Config& cfg, const Encoders& encoders) {
  auto o = control_map_options_for(cfg);
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
