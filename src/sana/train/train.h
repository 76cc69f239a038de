// `sana-train --config C`'s entry point: the Trainer (train/loop/trainer.h) on this process,
// with the runtime it needs. Never includes torch, so the command that calls it compiles
// without torch's headers.
#pragma once

#include "sana/config/config.h"
#include "sana/distributed/launch_env.h"
#include "sana/train/test_hooks.h"

namespace sana::train {

// Runs the training the config describes; returns the process exit code (0). Errors are
// thrown (sana::Error and the runtime's PeerFailure, ...); a failing rank tells the others.
// `hooks`: the tests' fault injection (all off in production: TestHooks{}).
int train(const config::Config& cfg, const dist::LaunchEnv& env, const TestHooks& hooks);

}  // namespace sana::train
