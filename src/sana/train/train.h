// `sana-train --config C`'s entry point: the Trainer (train/trainer.h) on this process,
// with the runtime it needs. Never includes torch, so the command that calls it compiles
// without torch's headers.
#pragma once

#include "sana/config/config.h"
#include "sana/distributed/launch_env.h"

namespace sana::train {

// Runs the training the config describes; returns the process exit code (0). Errors are
// thrown (sana::Error and the runtime's PeerFailure, ...); a failing rank tells the others.
int train(const config::Config& cfg, const dist::LaunchEnv& env);

}  // namespace sana::train
