// dist.elastic continue: whether a step is applied, decided through the run's store, so
// that no two ranks of a group ever disagree, whoever dies when (Runtime::commit_step).
//
// Each rank adds 1 to the step's count once its agreement all-reduce is through. The rank
// whose add makes the count the world size commits the step for all. A rank that learns
// of a loss while it waits seals the count (adds -2^40: no add can complete it after
// that); the first sealer reads from its add's result whether every rank had come, and
// says so. Everyone else reads the decision. A rank that never came (its all-reduce
// failed) has nothing to decide: the count never reached the world size, so nobody
// applied the step.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace sana::dist {

// The step's verdict under `key` (its count; the decision under key + "/decision") in a
// group of `world`: true applied by all, false by none; nullopt when nobody decided
// within `limit`. `loss_declared` is polled while this rank waits; `check` is called each
// round and throws to stop waiting (the run's failure).
std::optional<bool> decide_commit(c10d::Store& store, const std::string& key, int world,
                                  const std::function<bool()>& loss_declared, const std::function<void()>& check,
                                  std::chrono::milliseconds limit);

}  // namespace sana::dist
