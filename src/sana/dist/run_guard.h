// How a subcommand's failure becomes an exit code and a message the user can act on,
// the same on every rank. The header needs no torch.
#pragma once

#include <functional>
#include <string>

#include "sana/dist/launch_env.h"

namespace sana::dist {

// Runs `body`, mapping its exceptions to exit codes (util/exit_codes.h) and logging them:
// launch/device/agreement problems -> 2, another rank failed -> 3, anything else -> 1.
int run_guarded(const LaunchEnv& env, const std::function<int()>& body);

// Best effort for a rank that fails before it could start its runtime (e.g. a config
// error): posts the failure to the store when one is reachable within a few seconds,
// so the other ranks stop at once instead of waiting for the timeout.
void report_startup_failure(const LaunchEnv& env, const std::string& addr, int port,
                            const std::string& reason) noexcept;

}  // namespace sana::dist
