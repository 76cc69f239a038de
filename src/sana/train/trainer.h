// The training loop: `sana-train --config C` on one or many processes. Every rank builds
// the same epoch plan and the same model (rank 0's weights broadcast and fingerprinted),
// feeds its slice of each global batch through the flow-matching objective, syncs
// gradients with the overlapped engine (GradSync), and takes the same optimizer step.
// One small all-reduce per step carries the loss, bad-sample counts and flags ("stop
// requested", "non-finite"), so an epoch or a run ends on every rank at the same step;
// a failing rank makes the others exit through the runtime's failure watch. Never hangs.
#pragma once

#include "sana/config/config.h"
#include "sana/dist/launch_env.h"

namespace sana::train {

// Runs the training the config describes; returns the process exit code. Exceptions of
// the runtime (PeerFailure, Disagreement, ...) propagate to dist::run_guarded.
int train(const config::Config& cfg, const dist::LaunchEnv& env);

}  // namespace sana::train
