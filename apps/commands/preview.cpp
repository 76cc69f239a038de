// `sana-train preview --config C [--weights FILE] [--out DIR]`: preview grids (one PNG per
// showcase bucket: square, tallest, widest) from initial or given weights, with the
// config's sampler, steps, guidance and seed (train/previews/sampling.h samples them).
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>

#include "command.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/previews/previews.h"
#include "sana/util/log.h"

namespace sana::app {

namespace {

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
    const auto spec = train::model_spec_for(cfg);
    model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, static_cast<uint64_t>(cfg.train.seed)});
    if (!weights_.empty()) {
      const auto report = model::load_weights(*net, weights_, /*strict=*/true);
      log::info("weights: {} from {}", report.summary(), weights_);
    } else {
      log::info("no --weights: previews of the initial weights (seed {})", cfg.train.seed);
    }
    const auto encoders =
        train::load_encoders(train::encoder_options_for(cfg), torch::kCPU, train::EncoderUse::previews, spec.conditioning);
    if (!weights_.empty()) train::use_empty_prompt(net, encoders, config::null_embed_file(cfg));
    const auto sources = train::preview_sources_for(cfg);
    const auto o = train::preview_setup(sources, torch::kCPU, encoders, spec);
    const std::string dir = out_.empty() ? (std::filesystem::path(cfg.work_dir) / "previews").string() : out_;
    const auto start = std::chrono::steady_clock::now();
    const auto paths = train::render_previews(net, sources.buckets, o, dir, "preview");
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
