// `sana-train check-data --config C [--limit N] [--fill-cache] [--dump DIR]`: decodes every
// sample through the real loader (data/check_data.h) and prints good and bad counts by
// reason and images/s; more bad samples than data.max_bad_fraction is a failure (exit 1).
// --fill-cache also fills the data.cache: disk file, so training starts with every sample
// decoded. --dump writes each bucket image as training sees it, with a table (dump.tsv).
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "sana/data/check_data.h"
#include "sana/data/png_decode.h"
#include "sana/data/sample_cache.h"
#include "sana/train/options/core_options.h"
#include "sana/util/error.h"

namespace sana::app {

namespace {

class CheckData : public ConfigSubcommand {
 public:
  explicit CheckData(CLI::App& app)
      : ConfigSubcommand(app, "check-data", "decode every sample through the real loader; count bad ones by reason") {
    cli_->add_option("--limit", limit_, "decode only this many samples");
    cli_->add_flag("--fill-cache", fill_cache_,
                   "also store every decoded sample in the data.cache: disk file that training with this config "
                   "reads (data.cache_dir)");
    cli_->add_option("--dump", dump_dir_,
                     "write each sample's bucket image as the model receives it (8-bit RGB PNG, before "
                     "normalisation and flips) into this folder, with dump.tsv: id, path, height, width, file");
  }
  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    const auto spec = train::model_spec_for(cfg);
    data::CheckDataOptions o;
    o.dataset = train::dataset_options_for(cfg);
    o.loader = train::loader_options_for(cfg);
    // A ControlNet's control images or latents from the data are read too: one missing or
    // broken is a bad sample, as in training. (Maps made from the image need no check.)
    if (spec.control_blocks > 0 &&
        (cfg.data.load_vae_feat || cfg.controlnet.control_signal_type == config::ControlSignal::dataset)) {
      o.loader.control = train::control_map_options_for(cfg);
    }
    o.limit = limit_;
    o.fill_cache = fill_cache_;
    o.disk_cache = train::disk_cache_options_for(cfg);
    o.token_cell = spec.downsample * spec.patch;
    o.dump_dir = dump_dir_;
    if (!dump_dir_.empty() && cfg.data.load_vae_feat) {
      throw UsageError("--dump writes decoded images, and data.load_vae_feat is true (this config trains on "
                       "precomputed latents, not pixels); dump with a config that reads the images",
                       "usage error");
    }
    const auto r = data::check_data(o);
    std::cout << fmt::format("check-data: {} samples in {:.1f} s ({:.1f} images/s, {} workers)\n", r.samples,
                             r.seconds, r.samples / r.seconds, r.workers);
    std::cout << fmt::format("  good: {}\n", r.samples - r.substituted);
    for (const auto& [reason, n] : r.bad_by_reason) std::cout << fmt::format("  bad, {}: {}\n", reason, n);
    for (const auto& [reason, n] : data::codec_warning_counts()) {
      std::cout << fmt::format("  decoded with a codec warning, '{}': {}\n", reason, n);
    }
    std::cout << fmt::format("  bad fraction {:.4f} (data.max_bad_fraction {})\n", r.bad_fraction(),
                             cfg.data.max_bad_fraction);
    if (r.bad_fraction() > cfg.data.max_bad_fraction) {
      std::cout << std::flush;
      throw RunError("too many bad samples; fix or remove them (the log names each file once)", "check-data");
    }
    if (!dump_dir_.empty()) {
      std::cout << fmt::format("  dump: {} bucket images and dump.tsv in {}\n", r.dumped, dump_dir_);
    }
    if (fill_cache_) {
      std::cout << fmt::format("  cache: {} ({}), {} samples were ready before; training with data.cache: disk "
                               "and this config reads it\n", r.cache_path, data::size_text(r.cache_bytes),
                               r.cache_ready_before);
    }
    std::cout << "check-data: ok\n";
    return 0;
  }

 private:
  int64_t limit_ = 0;
  bool fill_cache_ = false;
  std::string dump_dir_;
};

}  // namespace

std::unique_ptr<ConfigCommand> check_data_command(CLI::App& app) { return std::make_unique<CheckData>(app); }

}  // namespace sana::app
