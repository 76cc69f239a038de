// train.eval: a held-out loss (SimpleTuner's EVAL_LOSS), a curve that means something where
// the training loss is noise. Every train.eval.every_steps steps each held-out sample is
// measured at each of train.eval.timesteps with noise drawn from (train.seed, sample, t)
// alone: the same samples, timesteps and noise at every evaluation and world size. Sample i
// of N is measured by rank i mod W, in one forward of a row per timestep (so no other sample
// shares its batch); every rank then sums every sample's losses in sample order, so the
// result is the same at any world size (bitwise with train.deterministic, whose ranks
// compute alike).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/data/loader_options.h"
#include "sana/distributed/runtime.h"
#include "sana/train/step/train_step.h"

namespace sana::train {

// One evaluation's means: over every sample at each timestep, and over all of them.
struct EvalResult {
  int64_t global_step = 0;
  int64_t samples = 0;
  double loss = 0;
  std::map<int64_t, double> by_timestep;  // timestep -> mean loss
  double seconds = 0;
  std::string line() const;  // "eval at step 40: loss 0.4123 over 32 samples (t100 0.0950, ...) in 3.1 s"
};

struct EvalOptions {
  int64_t every_steps = 0;
  std::vector<int64_t> timesteps;
  int64_t max_samples = 0;  // 0: all
};

class EvalLoss {
 public:
  // `loader`: the run's loader settings (the held-out samples' decoding, captions, masks);
  // flips are turned off.
  EvalLoss(EvalOptions options, data::Dataset held_out, data::LoaderOptions loader, dist::Runtime& rt);

  bool due(int64_t global_step) const { return o_.every_steps > 0 && global_step % o_.every_steps == 0; }
  int64_t samples() const { return count_; }
  // Every rank (collective): measures this rank's samples with `step` and agrees on the
  // means. Under ZeRO stage 3 the caller holds the whole model (parallel::Zero::Whole): the
  // forwards are then no collectives.
  EvalResult run(TrainStep& step, int64_t global_step);

 private:
  EvalOptions o_;
  data::Dataset held_out_;
  data::LoaderOptions loader_;
  dist::Runtime& rt_;
  int64_t count_ = 0;
};

}  // namespace sana::train
