// The model a run starts from, the same on every rank: initialised from train.seed, grown
// from a smaller checkpoint (model_growth) or loaded (model.load_from), then rank 0's
// weights broadcast and their checksum agreed. A collective: every rank calls it at the
// same point of start-up.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "sana/config/config.h"
#include "sana/distributed/runtime.h"
#include "sana/model/sana_ms.h"
#include "sana/model/spec.h"

namespace sana::train {

model::SanaMS build_initial_model(const config::Config& cfg, const model::ModelSpec& spec, dist::Runtime& rt);

// A hash of every parameter's name, shape and bytes, in order: equal on every rank exactly
// when the weights are bitwise equal (start-up and the end of a run compare it).
std::string weights_checksum(const torch::nn::Module& model);
// The same hash over named tensors in the given order (a module's parameters, adapters).
std::string tensors_checksum(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

}  // namespace sana::train
