// Failure detection through the store, on a thread of its own with its own store
// connection: every rank writes a heartbeat; rank 0 declares a rank dead when its
// heartbeat stops; every rank exits when the store's failure key appears or when the
// store itself (rank 0) is gone. The main thread may be stuck in a collective meanwhile.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "sana/distributed/launch_env.h"

namespace sana::dist {

// Store keys of the failure protocol (under kStorePrefix).
namespace keys {
inline std::string heartbeat(int rank) { return "hb/" + std::to_string(rank); }
inline std::string finished(int rank) { return "finished/" + std::to_string(rank); }
inline std::string ack(int rank) { return "ack/" + std::to_string(rank); }
constexpr const char* kFailed = "failed";
constexpr const char* kFailedCount = "failed_count";
}  // namespace keys

// Publishes `reason` as the run's failure unless another rank was first. Never throws.
void publish_failure(c10d::Store& store, const std::string& reason) noexcept;

// The failure reason if one was published, else "".
std::string published_failure(c10d::Store& store);
// The same, but "" also when the store cannot be asked (it is gone): for error paths.
std::string published_failure_or_empty(c10d::Store& store) noexcept;

// Rank 0 hosts the store: before it exits it gives the other ranks up to `grace` to read
// the failure (each acknowledges), so they stop with the real reason.
// `dead_rank` (if >= 0) is not waited for.
void wait_for_acks(c10d::Store& store, int world_size, std::chrono::milliseconds grace,
                   int dead_rank = -1) noexcept;

// Logs `reason`, acknowledges it in the store, and ends the process with kExitPeerFailed.
[[noreturn]] void exit_for_peer_failure(c10d::Store* store, int rank, int world_size,
                                        const std::string& reason, int dead_rank = -1);

class FailureWatch {
 public:
  FailureWatch(const RendezvousEndpoint& endpoint, int rank, int world_size,
               std::chrono::milliseconds heartbeat_timeout, std::chrono::milliseconds timeout);
  ~FailureWatch();
  FailureWatch(const FailureWatch&) = delete;
  FailureWatch& operator=(const FailureWatch&) = delete;

  void stop();

 private:
  void run();
  void check_heartbeats(std::vector<int64_t>& last, std::vector<std::chrono::steady_clock::time_point>& since);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds heartbeat_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sana::dist
