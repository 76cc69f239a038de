// `sana-train model --config C [--json]`: what a config's model is, without training it.
// The model is built on the meta device (no weights allocated, so the 1.6 B preset is
// instant), then its parameters are counted per top-level module, and its forward FLOPs
// per sample are given for the square, tallest and widest bucket of each base size.
#pragma once

#include "sana/config/config.h"

namespace sana::model {

struct ModelCommand {
  bool json = false;
};

int run_model_command(const config::Config& cfg, const ModelCommand& cmd);

}  // namespace sana::model
