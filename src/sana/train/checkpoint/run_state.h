// Where the run stands, as its checkpoints keep it (trainer_state.json, ckpt/checkpoint.h):
// the position (epoch, step in it, global step, samples consumed) and the batch segments
// of the epoch in progress (more than one only after a resume that changed the batch
// mid-epoch), whether the run resumed, and the step it ends after.
//
// Owns: the position and the segments, and their round trip through ckpt::TrainerState.
// Never: plans an epoch (the dataset does, from segments()), decides when to save (the
// Checkpointer), or reads the config (the run's batch comes in as a BatchSpec).
#pragma once

#include <cstdint>
#include <vector>

#include "sana/ckpt/checkpoint.h"
#include "sana/data/dataset.h"

namespace sana::train {

using RunPosition = ckpt::RunPosition;

class RunState {
 public:
  // A fresh run at the start of epoch 0, batched as `batch` (train.global_batch_size or
  // train.batch_tokens).
  explicit RunState(data::BatchSpec batch) : batch_(batch), segments_{{0, batch}} {}

  const RunPosition& position() const { return position_; }
  const std::vector<data::EpochPart>& segments() const { return segments_; }
  bool resumed() const { return resumed_; }
  // The global step the run ends after (the current epoch's plan, then whole epochs, and
  // train.max_steps), as the trainer counts it once the run's position is known.
  int64_t total_steps() const { return total_steps_; }
  void plan_total_steps(int64_t steps) { total_steps_ = steps; }

  // After the step `step` of epoch `epoch` (from 0), which trained `samples` samples
  // (`epoch_end`: the epoch's last): the next epoch starts batched as this run is.
  void advance(int64_t epoch, int64_t step, bool epoch_end, int64_t samples);
  // What a checkpoint keeps of the run: `identity` (seed, world size, model, config) with
  // the position, this run's batch and, when the epoch in progress is batched in more than
  // one way, its segments.
  ckpt::TrainerState saved(ckpt::TrainerState identity) const;
  // A resume from `s`: its position and the epoch in progress batched as it was. Returns
  // whether `s` was batched otherwise than this run; then rebatch() follows.
  bool continue_at(const ckpt::TrainerState& s);
  // This run's batch from the current step on: the epoch's samples not yet seen are batched
  // anew (a new segment mid-epoch), later epochs too.
  void rebatch();

 private:
  data::BatchSpec batch_;
  RunPosition position_;
  std::vector<data::EpochPart> segments_;
  bool resumed_ = false;
  int64_t total_steps_ = 0;
};

}  // namespace sana::train
