// A short single-process training run that exercises config, data decoding, LibTorch
// and logging end to end until the Linear DiT trainer replaces it: decodes an image
// folder with OpenCV, trains a small convolutional denoiser with the flow-matching
// objective, and logs the loss. It never calls a collective. The header needs no torch.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "sana/config/config.h"

namespace sana::train {

struct InterimResult {
  int64_t images = 0;
  int64_t steps = 0;
  double first_loss = 0;  // mean over the first log interval
  double last_loss = 0;   // mean over the last log interval
  double seconds = 0;
};

// A request the interim trainer cannot serve (e.g. an optimizer it does not have yet).
class UnsupportedByInterimTrainer : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

InterimResult run_interim_training(const config::Config& cfg);

}  // namespace sana::train
