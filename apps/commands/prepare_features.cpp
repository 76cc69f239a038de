// `sana-train prepare-features --config C [--out DIR] [--batch-size N]`: the config's VAE and
// text encoder run once over the dataset, on every rank of a launch, and their outputs go
// to DIR (default <work_dir>/features) in the layout data.load_vae_feat / load_text_feat read
// (train/features/prepare_features.h). Resumable: a rerun skips every sample whose files exist. Ends
// by writing DIR/train.yaml, the config that trains on the features.
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "sana/train/features/prepare_features.h"

namespace sana::app {

namespace {

class PrepareFeatures : public ConfigSubcommand {
 public:
  PrepareFeatures(CLI::App& app, const train::TestHooks& hooks)
      : ConfigSubcommand(app, "prepare-features",
                         "run the config's VAE and text encoder over the dataset once (every rank its share) and "
                         "keep latents and caption features for data.load_vae_feat / load_text_feat"),
        hooks_(hooks) {
    cli_->add_option("--out", opts_.out, "output folder (default: <work_dir>/features); a rerun resumes in it");
    cli_->add_option("--batch-size", opts_.batch_size, "samples per encoder call (one bucket each)")
        ->check(CLI::PositiveNumber);
  }

  int run(const dist::LaunchEnv& env, const config::Config& cfg) override {
    open_run_log(cfg, env, "prepare_features");
    opts_.config_file = config_file();
    opts_.overrides = overrides();
    const auto r = train::prepare_features(cfg, env, opts_, hooks_);
    if (env.rank != 0) return 0;
    std::cout << fmt::format("prepare-features: {} samples: {} written now, {} there before, {} bad (left out)\n",
                             r.samples, r.written, r.existing, r.bad);
    std::cout << fmt::format("  {}: {}{}{}\n", r.out, r.latents ? "latents/ " : "", r.text ? "text/ " : "",
                             r.null_embed.empty() ? "" : "null_embed.safetensors ");
    std::cout << fmt::format("  {}: the config reading these features; train with sana-train --config {}\n",
                             r.train_config, r.train_config);
    return 0;
  }

 private:
  const train::TestHooks& hooks_;
  train::PrepareOptions opts_;
};

}  // namespace

std::unique_ptr<ConfigCommand> prepare_features_command(CLI::App& app, const train::TestHooks& hooks) {
  return std::make_unique<PrepareFeatures>(app, hooks);
}

}  // namespace sana::app
