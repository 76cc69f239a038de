// `sana-train preview --config C [--weights FILE] [--out DIR]`: preview grids (one PNG per
// showcase bucket: square, tallest, widest) from initial or given weights, with the
// config's sampler, steps, guidance and seed (diffusion/preview.h samples them).
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>

#include "command.h"
#include "sana/diffusion/preview.h"
#include "sana/model/encoders.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/log.h"

namespace sana::app {

namespace {

// The config's preview options, with the VAE decoder and the prompts' caption features
// where the config has TorchScript encoders.
diffusion::PreviewOptions preview_options(const config::Config& cfg, const model::ModelSpec& spec) {
  auto o = diffusion::preview_options_for(cfg);
  if (cfg.vae.vae_type == "torchscript") {
    auto vae = std::make_shared<model::FrozenVae>(model::FrozenVae::load(cfg.vae, torch::kCPU));
    if (vae->can_decode()) {
      o.decode = [vae](const torch::Tensor& z) { return vae->decode(z); };
    } else {
      log::warn("vae.vae_pretrained has no decode(): previews show latent channels 0-2");
    }
  }
  if (spec.conditioning == model::Conditioning::caption) {
    if (cfg.text_encoder.text_encoder_name == "torchscript" && !cfg.train.validation_prompts.empty()) {
      auto text = model::FrozenTextEncoder::load(cfg.text_encoder, torch::kCPU);
      std::tie(o.caption_features, o.caption_mask) = text.encode(cfg.train.validation_prompts);
    } else {
      log::warn("no text encoder or train.validation_prompts: caption previews use the null caption");
    }
  }
  return o;
}

class Preview : public ConfigSubcommand {
 public:
  explicit Preview(CLI::App& app)
      : ConfigSubcommand(app, "preview",
                         "sample preview grids (square, tallest, widest bucket) from initial or given weights",
                         {/*required=*/true, /*data=*/false}) {
    cli_->add_option("--weights", weights_, "model weights (.safetensors or torch.save'd)");
    cli_->add_option("--out", out_, "output folder (default: <work_dir>/previews)");
  }

  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    const auto spec = model::spec_from_config(cfg);
    model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, static_cast<uint64_t>(cfg.train.seed)});
    if (!weights_.empty()) {
      const auto report = model::load_weights(*net, weights_, /*strict=*/true);
      log::info("weights: {} from {}", report.summary(), weights_);
    } else {
      log::info("no --weights: previews of the initial weights (seed {})", cfg.train.seed);
    }
    const auto o = preview_options(cfg, spec);
    const std::string dir = out_.empty() ? (std::filesystem::path(cfg.work_dir) / "previews").string() : out_;
    const auto start = std::chrono::steady_clock::now();
    const auto paths = diffusion::render_previews(net, diffusion::preview_buckets_for(cfg), o, dir, "preview");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& p : paths) std::cout << p << "\n";
    log::info("{} preview grids of {} images, {} {} steps, guidance {}, in {:.1f} s", paths.size(), o.images,
              o.sampler, o.steps, o.cfg_scale, secs);
    return 0;
  }

 private:
  std::string weights_;  // .safetensors or a torch.save'd state dict; empty: initial weights
  std::string out_;      // default: <work_dir>/previews
};

}  // namespace

std::unique_ptr<ConfigCommand> preview_command(CLI::App& app) { return std::make_unique<Preview>(app); }

}  // namespace sana::app
