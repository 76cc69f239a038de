// `sana-train check-dist`: the pre-flight check of a cluster (like nccl-tests): rendezvous,
// device map, agreement, then all-reduce bandwidth for a range of sizes, printed by rank 0;
// optionally a soak of all-reduces for a while. Needs no config file. No torch here.
#pragma once

#include <cstdint>
#include <vector>

#include <string>

#include "sana/distributed/launch_env.h"
#include "sana/distributed/options.h"

namespace sana::dist {

struct CheckDistOptions {
  RuntimeOptions runtime;          // the dist.* keys of the config (or their defaults)
  std::string config_fingerprint;  // what every rank must agree on
  std::string flight_dir;          // where a rank's flight record goes on a failure ("": none)
  double soak_seconds = 0;  // keep all-reducing this long after the table
  std::vector<int64_t> sizes_bytes = {1 << 10, 16 << 10, 256 << 10, 1 << 20,
                                      4 << 20, 16 << 20, 64 << 20};
};

// Returns the process exit code; prints its report on rank 0 (stdout).
int run_check_dist(const LaunchEnv& env, const CheckDistOptions& opts);

}  // namespace sana::dist
