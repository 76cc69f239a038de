// One worker process of `sana-train launch` (launcher.h): its environment and start, its
// output passed on line by line, its state. Plain POSIX; no torch.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "sana/distributed/launcher.h"

namespace sana::dist {

// One stream of one worker: bytes in, whole lines out with the rank in front (our log
// lines carry it already: "[time rN/W I] ...", the same as under torchrun or mpirun).
struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;
  std::string pending;

  void emit(const std::string& prefix, const std::string& line) const;
  // Reads what there is and passes on each whole line. Returns false at end of stream.
  bool pump(const std::string& prefix);
};

struct Worker {
  int rank = 0;  // a replacement's: its SANA_JOIN id
  int local_rank = 0;
  pid_t pid = -1;
  Stream out, err;
  std::optional<int> exit_code;
  bool left_out = false;  // "lost N": the others went on without it
  // Since when it has been seen stopped (SIGSTOP, a debugger); none while it runs.
  std::optional<std::chrono::steady_clock::time_point> stopped_since;
  std::string prefix() const;  // "[rank N] "
};

// The launcher's ends every worker inherits: the lifeline's read end (EOF when the
// launcher is gone) and the message pipe's write end (launcher_link.h).
struct WorkerPipes {
  int lifeline = -1;
  int messages = -1;
};

// The launcher's exit code for a worker's wait status (128 + signal when killed).
int exit_code_of(int status);
// Starts the worker of `local_rank` in its own process group with torchrun's environment.
// join_id >= 0: a replacement for a lost worker of that slot (SANA_JOIN), named so.
Worker spawn(const LaunchOptions& o, int local_rank, int port, int attempt, const std::string& run_id,
             const WorkerPipes& pipes, int join_id = -1);
// `sig` to the process group of every worker still running.
void signal_all(std::vector<Worker>& workers, int sig);
// Whether `pid` is stopped (SIGSTOP, a debugger): it cannot act on SIGTERM until continued.
bool is_stopped(pid_t pid);
// Every worker reaped and its output drained.
bool all_exited(const std::vector<Worker>& workers);

}  // namespace sana::dist
