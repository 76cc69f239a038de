#include "sana/distributed/startup_failure.h"

#include <fmt/format.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "sana/distributed/failure_watch.h"
#include "sana/distributed/runtime.h"

namespace sana::dist {

void report_startup_failure(const LaunchEnv& env, const std::string& addr, int port,
                            const std::string& reason) noexcept {
  // Only where the launcher named the endpoint: a guessed default port could belong to
  // another run, which must not be told that it failed.
  if (env.world_size <= 1 || (env.master_port == 0 && !env.agent_store && addr.empty())) return;
  // On a thread of its own, waited for at most 20 s: a store host that accepts the
  // connection and then never answers (stopped) must not keep this process from exiting.
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  std::thread([env, addr, port, reason, done] {
    try {
      const RendezvousEndpoint ep = resolve_endpoint(env, addr, port);
      auto store = open_store(ep, std::chrono::seconds(5), std::chrono::seconds(5));
      publish_failure(*store, fmt::format("rank {} failed at start-up: {}", env.rank, reason));
      store->set(keys::ack(env.rank), std::vector<uint8_t>{'1'});
      if (ep.server) wait_for_acks(*store, env.world_size, std::chrono::seconds(10));
    } catch (const std::exception&) {
      // No store to tell: the others stop when their rendezvous times out.
    }
    done->set_value();
  }).detach();
  finished.wait_for(std::chrono::seconds(20));
}

}  // namespace sana::dist
