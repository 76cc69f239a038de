// Strings from every rank to rank 0 for a background thread (the checkpoint writer's
// commit), on a store connection of its own: the main thread's collectives and store
// calls go on meanwhile, untouched. Bounded: rank 0 waits at most `timeout` for the
// others, and stops at once when the run's failure is published.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "sana/distributed/launch_env.h"

namespace sana::dist {

class BackgroundGather {
 public:
  // `members`: each rank's original rank (dist.elastic continue: a rank declared lost
  // stops the wait at once); empty when they are the same.
  BackgroundGather(const RendezvousEndpoint& endpoint, int rank, int world_size, std::chrono::milliseconds timeout,
                   std::vector<int> members = {});
  // Every rank's `mine` under `name` (a new name each time), on rank 0 in rank order;
  // nothing elsewhere. The connection opens on first use, on the calling thread. Throws
  // DistTimeout naming the ranks still missing, or PeerFailure with the run's failure.
  std::vector<std::string> gather(const std::string& name, const std::string& mine);

 private:
  RendezvousEndpoint endpoint_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::vector<int> members_;
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace sana::dist
