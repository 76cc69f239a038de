#include "sana/train/previews.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "sana/data/image_header.h"
#include "sana/model/weights.h"
#include "sana/util/error.h"
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

std::string null_embed_file(const config::Config& cfg) {
  const auto& text = cfg.text_encoder;
  if (!text.null_embed_path.empty()) return text.null_embed_path;
  const std::filesystem::path root(cfg.train.null_embed_root);
  for (const std::string& name :
       {fmt::format("null_embed_diffusers_{}_{}token_{}.pth", text.text_encoder_name, text.model_max_length,
                    text.caption_channels),
        fmt::format("null_embed_diffusers_{}token.pth", text.model_max_length)}) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(root / name, ec)) return (root / name).string();
  }
  return "";
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

PreviewOptions preview_setup(const config::Config& cfg, torch::Device device, const Encoders& encoders,
                                        model::Conditioning conditioning) {
  auto o = preview_options_for(cfg);
  o.device = device;
  if (encoders.vae && encoders.vae->can_decode()) {
    auto vae = encoders.vae;
    o.decode = [vae](const torch::Tensor& z) { return vae->decode(z); };
  } else if (encoders.vae) {
    log::warn_shared("vae.vae_pretrained has no decode(): previews show latent channels 0-2");
  }
  if (conditioning == model::Conditioning::caption) {
    if (encoders.text && !cfg.train.validation_prompts.empty()) {
      std::tie(o.caption_features, o.caption_mask) = encoders.text->encode(cfg.train.validation_prompts);
    } else {
      log::warn_shared("no text encoder or train.validation_prompts: caption previews use the null caption");
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
  const auto dir = std::filesystem::path(cfg_.work_dir) / "previews";
  const std::string stem = fmt::format("step{:06d}", global_step);
  if (rank == 0 && !unpublished_.empty()) {
    log::info("TensorBoard: {} preview grid{} of other ranks never appeared in {} (a work_dir not shared between "
              "nodes?); left out", unpublished_.size(), unpublished_.size() == 1 ? "" : "s", dir.string());
    unpublished_.clear();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int renderer = rank0_renders_all ? 0 : static_cast<int>(b % static_cast<size_t>(world));
    const std::string size = fmt::format("{}x{}", buckets_[b].height, buckets_[b].width);
    const std::string path = (dir / fmt::format("{}_{}.png", stem, size)).string();
    if (rank == 0 && cfg_.train.report_to == "tensorboard") unpublished_.push_back({global_step, "preview/" + size, path});
    if (renderer == rank) {
      mine.push_back(buckets_[b]);
    } else if (rank == 0) {  // the terminal shows rank 0's lines: it names the others' grids too
      log::info("preview (rank {}): {}", renderer, path);
    }
  }
  auto opts = options_;
  int64_t evaluations = 0;
  if (rank0_renders_all) opts.on_step = [&] { rt_.work_progress(work, ++evaluations); };
  if (!mine.empty()) {
    for (const auto& p : render_previews(model_, mine, opts, dir.string(), stem)) log::info("preview: {}", p);
  }
  if (rank0_renders_all) rt_.work_done(work);
}

void Previews::publish(EventWriter* events) {
  if (events == nullptr || unpublished_.empty()) return;
  std::vector<Grid> waiting;
  for (auto& g : unpublished_) {
    std::ifstream in(g.path, std::ios::binary);  // written whole under a temporary name, then renamed
    if (!in) {
      waiting.push_back(std::move(g));
      continue;
    }
    const std::string png{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const auto size = data::read_image_size(reinterpret_cast<const unsigned char*>(png.data()), png.size());
    if (size.ok) events->image(g.step, g.tag, png, size.height, size.width);
  }
  unpublished_ = std::move(waiting);
  events->flush();
}

}  // namespace sana::train
