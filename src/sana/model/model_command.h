// `sana-train model --config C [--json]`: what a config's model is, without training it.
// The model is built on the meta device (no weights allocated, so the 1.6 B preset is
// instant), then its parameters are counted per top-level module, and its forward FLOPs
// per sample are given for the square, tallest and widest bucket of each base size.
#pragma once

#include <string>

#include "sana/config/config.h"

namespace sana::model {

struct ModelCommand {
  bool json = false;
};

int run_model_command(const config::Config& cfg, const ModelCommand& cmd);

// `sana-train preview --config C [--weights FILE] [--out DIR]`: preview grids (one PNG per
// showcase bucket: square, tallest, widest) from initial or given weights, with the
// config's sampler, steps, guidance and seed.
struct PreviewCommand {
  std::string weights;  // .safetensors or a torch.save'd state dict; empty: initial weights
  std::string out;      // default: <work_dir>/previews
};

int run_preview_command(const config::Config& cfg, const PreviewCommand& cmd);

}  // namespace sana::model
