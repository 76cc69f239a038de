#include "sana/distributed/launcher_store.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>

#include "sana/distributed/launch_env.h"

namespace sana::dist {

std::unique_ptr<StoreServer> host_store(const LaunchOptions& o, const std::string& run_id, const LauncherSay& say) {
  StoreServerOptions so;
  std::string note;
  so.bind_host = store_bind_host(o.master_addr, &note);
  if (!note.empty()) say(note);
  so.port = o.master_port;  // 0: any free one
  const char* token = std::getenv("SANA_RUN_TOKEN");
  so.token = token != nullptr ? token : derived_token("sana-launch", run_id, o.master_addr, o.master_port);
  try {
    return std::make_unique<StoreServer>(so);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "cannot host the run's store: {}; another run may hold the port: give another --master-port", e.what()));
  }
}

int serve_other_nodes(const StoreServer& store, std::chrono::milliseconds quiet, int signal_fd,
                      const LauncherSay& say) {
  if (store.clients() > 0) {
    say(fmt::format("this node's workers are done; the run's store stays up for the other nodes' workers ({} "
                    "connection{})",
                    store.clients(), store.clients() == 1 ? "" : "s"));
  }
  while (store.clients() > 0 && store.idle() < quiet) {
    pollfd fd{signal_fd, POLLIN, 0};
    unsigned char sig = 0;
    if (poll(&fd, 1, 200) > 0 && read(signal_fd, &sig, 1) == 1 && sig != SIGUSR1) {
      say(fmt::format("got signal {}; closing the run's store", static_cast<int>(sig)));
      return sig;
    }
  }
  if (store.clients() > 0) {
    say(fmt::format("the other nodes' workers asked nothing for {:.0f} s; closing the run's store",
                    std::chrono::duration<double>(quiet).count()));
  }
  return 0;
}

}  // namespace sana::dist
