// Process exit codes, the same for every subcommand and rank.
#pragma once

namespace sana {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;     // the run failed (an exception, a bad sample, ...)
constexpr int kExitUsage = 2;       // usage, config, launch-environment or device-map error
constexpr int kExitPeerFailed = 3;  // stopped because another rank failed or vanished

}  // namespace sana
