#include "sana/train/previews/previews.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sana/data/image_header.h"
#include "sana/model/weights.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

// A ControlNet's preview controls: the validation maps, else the maps of the dataset's first
// samples, each checked readable now rather than at the first preview.
void control_setup(const PreviewSources& src, const Encoders& encoders, const data::Dataset* dataset,
                   PreviewOptions& o) {
  if (src.vae_configured && !o.encode) {  // data.load_vae_feat: training loads no VAE
    log::warn_shared("previews of a ControlNet on precomputed latents sample without control: there is no VAE to "
                     "encode control maps with");
    return;
  }
  o.control_scale = src.control_scale;
  o.control_decode = src.control_decode;
  if (!src.validation_control_images.empty()) {
    o.control_images = src.validation_control_images;
    try {
      preview_controls(o, static_cast<int64_t>(o.control_images.size()), 64, 64);
    } catch (const std::runtime_error& e) {
      throw UsageError(fmt::format("controlnet.validation_scribble_maps: {}", e.what()), "config error");
    }
  } else if (dataset != nullptr) {  // the first samples whose image (or control image) decodes
    o.control_maps = control_maps_for(src.control_maps, encoders);
    const bool theirs = o.control_maps.kind == data::ControlKind::dataset;
    if (theirs) o.control_maps.kind = data::ControlKind::none;  // maps already
    const auto& index = dataset->index();
    for (uint64_t i = 0; i < index.size() && o.control_images.size() < static_cast<size_t>(o.images); ++i) {
      const std::string path = theirs ? data::control_image(index.text(i).meta) : std::string(index.text(i).path);
      if (!path.empty() && data::decode_to_bucket(path, 64, 64, false, o.control_decode).ok()) {
        o.control_images.push_back(path);
      }
    }
  }
  if (o.control_images.empty()) {
    log::warn_shared("a ControlNet without controlnet.validation_scribble_maps or readable samples: previews sample "
                     "without control");
    return;
  }
  log::info("previews: {} control image{} ({}), conditioning scale {:g}", o.control_images.size(),
            o.control_images.size() == 1 ? "" : "s",
            o.control_maps.kind == data::ControlKind::none ? "maps as they are" : o.control_maps.describe(),
            o.control_scale);
}

}  // namespace

PreviewOptions preview_setup(const PreviewSources& src, torch::Device device, const Encoders& encoders,
                             const model::ModelSpec& spec, const data::Dataset* dataset) {
  auto o = src.sampling;
  o.device = device;
  if (encoders.vae && encoders.vae->can_decode()) {
    auto vae = encoders.vae;
    o.decode = [vae](const torch::Tensor& z) { return vae->decode(z); };
  } else if (encoders.vae) {
    log::warn_shared("vae.vae_pretrained has no decode(): previews show latent channels 0-2");
  }
  if (encoders.vae) {
    auto vae = encoders.vae;
    o.encode = [vae](const torch::Tensor& x) { return vae->encode(x); };
  }
  if (spec.conditioning == model::Conditioning::caption) {
    if (encoders.text && !src.validation_prompts.empty()) {
      std::tie(o.caption_features, o.caption_mask) = encoders.text->encode(src.validation_prompts);
    } else {
      log::warn_shared("no text encoder or train.validation_prompts: caption previews use the null caption");
    }
  }
  if (spec.control_blocks > 0) control_setup(src, encoders, dataset, o);
  return o;
}

std::string preview_reason(const PreviewPolicy& t, int64_t global_step, int64_t total_steps, bool epoch_end,
                           int64_t epoch) {
  if (!t.visualize || global_step == total_steps) return "";
  if (t.eval_sampling_steps > 0 && global_step % t.eval_sampling_steps == 0) return "train.eval_sampling_steps";
  if (t.preview_every_epochs > 0 && epoch_end && (epoch + 1) % t.preview_every_epochs == 0) {
    return fmt::format("end of epoch {}", epoch + 1);
  }
  return "";
}

Previews::Previews(PreviewPolicy policy, const PreviewSources& sources, dist::Runtime& rt, model::SanaMS& model,
                   const Encoders& encoders, const data::Dataset& dataset)
    : policy_(std::move(policy)), rt_(rt), model_(model), buckets_(sources.buckets) {
  if (policy_.visualize) options_ = preview_setup(sources, rt.device(), encoders, model->spec(), &dataset);
}

void Previews::maybe_render(int64_t global_step, int64_t total_steps, bool epoch_end, int64_t epoch) {
  const auto why = due(global_step, total_steps, epoch_end, epoch);
  if (!why.empty()) render(global_step, why);
}

void Previews::render(int64_t global_step, const std::string& why) {
  const int rank = rt_.rank(), world = rt_.world_size();
  const bool rank0_renders_all = policy_.rank0_renders_all;
  const std::string work = fmt::format("previews of step {} ({})", global_step, why);
  if (rank0_renders_all && rank != 0) {
    rt_.wait_for_work(work, 0);  // cannot time out while rank 0 keeps sampling
    return;
  }
  std::vector<PreviewBucket> mine;
  const auto dir = std::filesystem::path(policy_.work_dir) / "previews";
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
    if (rank == 0 && policy_.tensorboard) unpublished_.push_back({global_step, "preview/" + size, path});
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
