// The activations of a step, measured (memory_estimate.h uses them): the bytes a forward and
// backward hold above the state, from the model built at depth 1 and 2 on a few token grids
// on the CPU, as terms per sample that scale to any depth, bucket and micro-batch.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "sana/model/spec.h"
#include "sana/train/report/memory_estimate.h"

namespace sana::train::activation_terms {

// The memory a step's forward and backward need above the state, for one sample: per image
// token and per sample (the caption's tokens, the timestep, linear attention's key-value
// state), outside the blocks and per block: the activations kept for the backward and the
// backward's working memory at its peak.
struct PerSample {
  double outside = 0, outside_per_token = 0, block = 0, block_per_token = 0;
  double bytes(int64_t depth, int64_t tokens, int64_t batch) const {
    const auto n = static_cast<double>(tokens);
    return (outside + outside_per_token * n + static_cast<double>(depth) * (block + block_per_token * n)) *
           static_cast<double>(batch);
  }
};

// A step's activations from the measured terms at `micro_batch` with every `gc_step`-th
// block checkpointed (0: none).
double step_activations(const PerSample& plain, const PerSample& kept, const model::ModelSpec& spec, int64_t tokens,
                        int64_t micro_batch, int64_t gc_step);
PerSample per_sample_of(const std::map<std::string, double>& terms);
// The terms without and with gradient checkpointing.
std::pair<PerSample, PerSample> measure(const model::ModelSpec& spec);
// SANA-Sprint's stage 2: its graphs held at once, from the student's terms, into `e`.
void add_stage2_graphs(const MemoryEstimateOptions::Sprint& sprint, const PerSample& plain, const PerSample& kept,
                       int64_t depth, MemoryEstimate& e);

}  // namespace sana::train::activation_terms
