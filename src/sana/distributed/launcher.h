// `sana-train launch`: starts the workers of one node with a torchrun-style environment,
// prefixes their output with the rank, forwards SIGINT/SIGTERM, stops every worker when
// one fails, restarts them all up to max_restarts times, and leaves no orphans (workers
// die with the launcher). Plain POSIX; never includes torch.
#pragma once

#include <string>
#include <vector>

namespace sana::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (single node only)
  int max_restarts = 0;
  double grace_s = 10;      // after SIGTERM, workers get this long before SIGKILL
  std::string program;      // worker executable: this one, or worker_args[0] if it is a path
  std::vector<std::string> worker_args;
  // Tests only: the worker of this local rank waits this long between fork and exec, its
  // signals held (train::TestHooks::spawn_pause).
  int pause_local_rank = -1;
  int pause_before_exec_ms = 0;
};

// Checks options; returns "" or what is wrong (a usage error).
std::string check_launch_options(const LaunchOptions& opts);

// Runs the workers to the end; returns the launcher's exit code: 0 when every worker
// succeeded, else the first failure's code (128 + signal for a killed worker).
int run_launcher(const LaunchOptions& opts);

}  // namespace sana::dist
