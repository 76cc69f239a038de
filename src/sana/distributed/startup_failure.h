// A rank that fails before it could start its runtime (e.g. a config error) tells the
// others through the store, so they stop at once instead of waiting for the timeout.
// The header needs no torch.
#pragma once

#include <string>

#include "sana/distributed/launch_env.h"

namespace sana::dist {

// Best effort: posts the failure to the store when one is reachable within a few seconds
// (only where the launcher named the endpoint); never throws.
void report_startup_failure(const LaunchEnv& env, const std::string& addr, int port,
                            const std::string& reason) noexcept;

}  // namespace sana::dist
