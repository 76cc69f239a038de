// What the run looks at between steps, with the whole model: the preview images
// (previews.h) and the held-out loss (eval_loss.h, train.eval).
//
// Owns: both, built once per trainer (the held-out loader anew after a regroup).
// Never: decides when a step is taken or saved.
#pragma once

#include <optional>

#include "sana/train/previews/eval_loss.h"
#include "sana/train/previews/previews.h"

namespace sana::train {

struct Evaluation {
  std::optional<Previews> previews;
  std::optional<EvalLoss> held_out;  // train.eval (none when off)
};

}  // namespace sana::train
