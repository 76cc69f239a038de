// `sana-train launch` on node 0 hosts the run's store (store_server.h), so that it
// outlives every worker: under dist.elastic continue the run goes on without rank 0 too.
// Its workers and those of the other nodes are its clients (SANA_LAUNCHER_STORE=1); a
// config that names another dist.master_addr/master_port has rank 0 host one there
// instead, as under any other launcher. Plain POSIX; never includes torch.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "sana/distributed/launcher.h"
#include "sana/distributed/store_server.h"

namespace sana::dist {

using LauncherSay = std::function<void(const std::string&)>;

// The store for one attempt (`run_id`): on the master address's interface, at
// --master-port or a free port (StoreServer::port(), given to the workers as MASTER_PORT),
// with SANA_RUN_TOKEN or, on several nodes without one, the token every rank derives.
// Throws std::runtime_error saying what to change when it cannot listen.
std::unique_ptr<StoreServer> host_store(const LaunchOptions& o, const std::string& run_id, const LauncherSay& say);

// Node 0's workers are done, but the store is the whole run's: the other nodes' workers
// may still be finishing, or under dist.elastic continue training on without node 0's.
// Serves while any of them is connected and asking (a live worker beats every 0.5 s;
// `quiet` without a request ends it), or until a signal arrives on `signal_fd` (the
// launcher's signal pipe); returns that signal (0: none).
int serve_other_nodes(const StoreServer& store, std::chrono::milliseconds quiet, int signal_fd,
                      const LauncherSay& say);

}  // namespace sana::dist
