// When and how the training loop saves: the save policy (train.save_model_steps,
// train.save_model_epochs, a stop request, the end of training) and the background write
// of rank 0's snapshot. The loop only says where it is; it never holds save policy. What
// goes into a checkpoint is the caller's capture(), so resume is its inverse.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "sana/ckpt/checkpoint.h"
#include "sana/config/config.h"

namespace sana::train {

// Where a run stands: the next step of which epoch's plan, and optimizer steps done.
struct RunPosition {
  int64_t epoch = 0;          // from 0
  int64_t step_in_epoch = 0;  // the next step of that epoch's plan
  int64_t global_step = 0;
  int64_t consumed_samples = 0;  // samples of all steps so far (global batches vary with batch changes)
};

// Why a checkpoint is due after the step that made `global_step` steps (ending epoch
// `epoch`, from 0, when `epoch_end`), or "" when none is.
std::string save_reason(const config::TrainConfig& t, int64_t global_step, int64_t total_steps, bool epoch_end,
                        int64_t epoch, bool stop_requested);

class Checkpointer {
 public:
  // Only the writing rank (rank 0) captures and writes; every rank follows the policy.
  Checkpointer(const config::Config& cfg, bool writes);

  // After each step: `next` is where a resume continues. Saves when save_reason() says so
  // and this step was not saved yet; capture() runs only on the writing rank.
  void maybe_save(const RunPosition& next, int64_t total_steps, bool epoch_end, int64_t epoch, bool stop_requested,
                  const std::function<ckpt::Snapshot()>& capture);
  // Saves now (once per step) for the given reason.
  void save(const RunPosition& next, const std::string& why, const std::function<ckpt::Snapshot()>& capture);
  // Waits for the background write (rethrowing its failure) and names the last checkpoint.
  void finish();

 private:
  const config::Config& cfg_;
  bool writes_;
  ckpt::AsyncSaver saver_;
  int64_t last_saved_ = -1;
};

}  // namespace sana::train
