#include "sana/train/previews.h"

#include <fmt/format.h>

#include <filesystem>

#include "sana/util/log.h"

namespace sana::train {

Encoders load_encoders(const config::Config& cfg, torch::Device device, EncoderUse use,
                       model::Conditioning conditioning) {
  const bool training = use == EncoderUse::training;
  Encoders e;
  if (config::uses_vae(cfg.vae) && !(training && cfg.data.load_vae_feat)) {
    e.vae = std::make_shared<model::FrozenVae>(model::FrozenVae::load(cfg.vae, device));
  }
  const bool wanted = training ? !cfg.data.load_text_feat
                               : conditioning == model::Conditioning::caption && !cfg.train.validation_prompts.empty();
  if (config::uses_text_encoder(cfg.text_encoder) && wanted) {
    e.text = std::make_shared<model::FrozenTextEncoder>(model::FrozenTextEncoder::load(cfg.text_encoder, device));
  }
  return e;
}

bool use_empty_prompt(model::SanaMS& model, const Encoders& encoders) {
  if (!encoders.text || !model->caption_embedder) return false;
  torch::NoGradGuard no_grad;
  auto& null_caption = model->caption_embedder->y_embedding;
  null_caption.copy_(encoders.text->empty_prompt().to(null_caption.device(), null_caption.scalar_type()));
  log::info("y_embedder.y_embedding: the text encoder's empty-prompt features, as upstream sets it on loading");
  return true;
}

PreviewOptions preview_setup(const config::Config& cfg, torch::Device device, const Encoders& encoders,
                                        model::Conditioning conditioning) {
  auto o = preview_options_for(cfg);
  o.device = device;
  if (encoders.vae && encoders.vae->can_decode()) {
    auto vae = encoders.vae;
    o.decode = [vae](const torch::Tensor& z) { return vae->decode(z); };
  } else if (encoders.vae) {
    log::warn("vae.vae_pretrained has no decode(): previews show latent channels 0-2");
  }
  if (conditioning == model::Conditioning::caption) {
    if (encoders.text && !cfg.train.validation_prompts.empty()) {
      std::tie(o.caption_features, o.caption_mask) = encoders.text->encode(cfg.train.validation_prompts);
    } else {
      log::warn("no text encoder or train.validation_prompts: caption previews use the null caption");
    }
  }
  return o;
}

std::string preview_reason(const config::TrainConfig& t, int64_t global_step, int64_t total_steps, bool epoch_end,
                           int64_t epoch) {
  if (!t.visualize || global_step == total_steps) return "";
  if (t.eval_sampling_steps > 0 && global_step % t.eval_sampling_steps == 0) return "train.eval_sampling_steps";
  if (t.preview_every_epochs > 0 && epoch_end && (epoch + 1) % t.preview_every_epochs == 0) {
    return fmt::format("end of epoch {}", epoch + 1);
  }
  return "";
}

Previews::Previews(const config::Config& cfg, dist::Runtime& rt, model::SanaMS& model, const Encoders& encoders)
    : cfg_(cfg), rt_(rt), model_(model), buckets_(preview_buckets_for(cfg)) {
  if (cfg.train.visualize) options_ = preview_setup(cfg, rt.device(), encoders, model->spec().conditioning);
}

void Previews::maybe_render(int64_t global_step, int64_t total_steps, bool epoch_end, int64_t epoch) {
  const auto why = preview_reason(cfg_.train, global_step, total_steps, epoch_end, epoch);
  if (!why.empty()) render(global_step, why);
}

void Previews::render(int64_t global_step, const std::string& why) {
  const int rank = rt_.rank(), world = rt_.world_size();
  const bool rank0_renders_all = cfg_.train.preview_on == config::PreviewOn::rank0;
  const std::string work = fmt::format("previews of step {} ({})", global_step, why);
  if (rank0_renders_all && rank != 0) {
    rt_.wait_for_work(work, 0);  // cannot time out while rank 0 keeps sampling
    return;
  }
  std::vector<PreviewBucket> mine;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (rank0_renders_all || static_cast<int>(b % static_cast<size_t>(world)) == rank) mine.push_back(buckets_[b]);
  }
  auto opts = options_;
  int64_t evaluations = 0;
  if (rank0_renders_all) opts.on_step = [&] { rt_.work_progress(work, ++evaluations); };
  if (!mine.empty()) {
    const auto dir = (std::filesystem::path(cfg_.work_dir) / "previews").string();
    for (const auto& p : render_previews(model_, mine, opts, dir, fmt::format("step{:06d}", global_step))) {
      log::info("preview: {}", p);
    }
  }
  if (rank0_renders_all) rt_.work_done(work);
}

}  // namespace sana::train
