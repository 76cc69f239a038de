#include "sana/train/config_checks.h"

#include <fmt/format.h>

#include "sana/config/checks.h"
#include "sana/data/buckets.h"
#include "sana/data/dataset.h"
#include "sana/model/spec.h"
#include "sana/train/component_options.h"

namespace sana {

namespace {

// The preset's shape against the model keys, and every bucket against the model's cell
// (VAE downsampling x patch size): a bucket the model cannot tile is a config error now,
// not a shape error at the first batch of that bucket.
void check_model(const config::Config& cfg, config::IssueSink& issues) {
  model::ModelSpec spec;
  try {
    spec = train::model_spec_for(cfg);
  } catch (const model::SpecError& e) {
    issues.fail(e.key(), e.message());
    return;
  }
  const int64_t cell = spec.downsample * spec.patch;
  std::vector<data::BucketTable> tables;
  try {
    tables = data::bucket_tables_for(train::bucket_options_for(cfg));
  } catch (const std::exception&) {
    return;  // the table itself is reported by config's own checks
  }
  const bool generated = cfg.data.aspect_ratio_type == "generated";
  for (const auto& table : tables) {
    for (const auto& b : table.buckets()) {
      if (b.height % cell == 0 && b.width % cell == 0) continue;
      issues.fail(generated ? "data.bucket_step" : "model.model",
                  fmt::format("bucket {}x{} of the {} px table is not a multiple of {} (the model's "
                              "cell: {} px per {} x patch {} of {})",
                              b.height, b.width, table.base(), cell, spec.downsample,
                              spec.downsample == 1 ? "pixel" : "latent", spec.patch, spec.name),
                  generated ? fmt::format("use a data.bucket_step that is a multiple of {}", cell)
                            : "use a preset with a smaller patch size");
      return;
    }
  }
}

}  // namespace

void register_checks() {
  std::vector<std::string> names;
  for (const auto& p : model::presets()) names.push_back(p.name);
  config::register_choices("model.model", std::move(names));
  config::register_check("model and buckets", check_model);
}

}  // namespace sana
