// A short single-process training run until the distributed trainer (issue 6) replaces
// it: decodes an image folder with OpenCV (center squares, in memory), trains the config's
// SanaMS model (unconditional, pixel space) with the flow-matching objective and AdamW,
// logs the loss, writes the final weights and preview grids. It never calls a collective.
// The header needs no torch.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/config/config.h"

namespace sana::train {

struct InterimResult {
  int64_t images = 0;
  int64_t steps = 0;
  double first_loss = 0;  // mean over the first log interval
  double last_loss = 0;   // mean over the last log interval
  double seconds = 0;
  std::string weights;                // work_dir/model.safetensors
  std::vector<std::string> previews;  // PNG grids (train.visualize)
};

// A request the interim trainer cannot serve (e.g. an optimizer it does not have yet).
class UnsupportedByInterimTrainer : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

InterimResult run_interim_training(const config::Config& cfg);

}  // namespace sana::train
