// What `sana-train model` shows (commands/model.cpp prints it as text or JSON), gathered
// once: the model's parameters and FLOPs per bucket, the memory estimate and what fits a
// device of a given size.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sana/config/config.h"
#include "sana/model/sana_ms.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/report/memory_estimate.h"
#include "sana/train/report/micro_batch.h"

namespace sana::app::model_facts {

struct BucketSize {
  int64_t base, height, width;
  model::Flops forward;  // per sample
  double train = 0;      // per sample: train::train_flops, what the run trains decides it
};

// What the command shows, gathered once for either format.
struct ModelFacts {
  model::ModelSpec spec;
  std::vector<std::pair<std::string, int64_t>> counts;
  int64_t total = 0;
  std::vector<std::vector<int64_t>> shapes;  // each parameter's, in the model's order
  std::string upstream_params;  // "" for our own presets
  std::vector<BucketSize> buckets;      // the showcase ones
  std::vector<BucketSize> all_buckets;  // every bucket of every table (JSON)
  std::optional<train::MemoryEstimate> memory;  // without --no-memory
  // For a device of `device_memory` bytes (--device-memory, else the GPU's): 2 GiB kept
  // for the CUDA context and the allocator's slack, the rest the budget.
  double device_memory = 0;
  std::optional<train::MicroBatchSuggestion> micro_batch;
  bool auto_micro_batch = false;  // train.micro_batch_size auto: `memory` is at the suggestion's pick
  // A frozen base on a device of `device_memory`: the fewest blocks train.offload_blocks must
  // swap for the config's total (with the frozen encoders) to fit, and that total; -1: none fits.
  std::optional<std::pair<int64_t, double>> swap;
  // SANA-Sprint stage 2 (a SanaMSCM preset): the frozen teacher and the discriminator heads.
  struct Sprint {
    std::string teacher;
    int64_t teacher_params = 0;
    std::vector<int64_t> blocks;
    int64_t heads_params = 0;
  };
  std::optional<Sprint> sprint;
  // The frozen encoders the training run loads on each process's device (none with
  // precomputed features), counted from their config.json; in bf16 unless dist.device cpu.
  std::vector<train::EncoderWeights> encoders;
  int64_t encoder_bytes() const { return train::total_bytes(encoders); }
};

ModelFacts facts_of(const config::Config& cfg, bool memory, int world_size, bool activations, double device_memory);
// The GPU sizes (decimal GB, as sold) whose memory holds `bytes` plus 2 GiB for the CUDA
// context and the allocator's slack.
std::vector<int> gpus_that_fit(double bytes);
std::string thousands(int64_t n);  // 1,604,462,752

}  // namespace sana::app::model_facts
