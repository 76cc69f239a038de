// A worker's side of `sana-train launch` (launcher.h): the lifeline that ends the worker
// when its launcher is gone, and the lines it tells the launcher. Plain POSIX; no torch.
#pragma once

#include <string>

namespace sana::dist {

// The environment variables that carry the two pipes to a worker.
constexpr const char* kLifelineVariable = "SANA_LIFELINE_FD";  // its read end: EOF when the launcher is gone
constexpr const char* kMessagesVariable = "SANA_LAUNCHER_FD";  // its write end: lines for the launcher

// In a worker started by `sana-train launch` (SANA_LIFELINE_FD set): a background thread
// that ends this process when the launcher is gone, even if it was killed with SIGKILL
// and this process is not its direct child.
void exit_with_launcher();

// In a worker started by `sana-train launch`: a line for the launcher ("elastic": this run
// goes on without a lost rank, dist.elastic continue; "lost N": rank N left the group,
// kill it if it still runs). Nothing elsewhere.
void tell_launcher(const std::string& line);

}  // namespace sana::dist
