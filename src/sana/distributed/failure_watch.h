// Failure detection through the store, on a thread of its own with its own store
// connection: every rank writes a heartbeat; the watcher (rank 0) declares a rank dead
// when its heartbeat stops, the others watch the watcher; every rank exits when the
// store's failure key appears or when the store itself is gone. The main thread may be
// stuck in a collective meanwhile. Under dist.elastic continue the watcher declares a
// silent rank lost instead (keys::lost) and nobody exits: the main threads regroup; a
// rank that finds itself declared lost exits. Where the store outlives the ranks (our
// launcher hosts it), a silent watcher is declared lost by the others in turn, and the
// lowest member left watches; the store host's record of when each beat came lets a new
// watcher judge at once a rank that has long been silent.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
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
// dist.elastic continue: a rank declared lost (by original rank; the value says why), and
// how many have been.
inline std::string lost(int rank) { return "lost/" + std::to_string(rank); }
constexpr const char* kLostCount = "lost_count";
}  // namespace keys

// dist.elastic continue: declares original rank `rank` lost for `reason`, once however many
// ranks find it silent together; true for the one call that did.
bool declare_lost(c10d::Store& store, int rank, const std::string& reason);

// Whether `rank` was declared lost (true from the moment declare_lost began, before its
// reason is written).
bool is_declared_lost(c10d::Store& store, int rank);

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

// Logs "stopping: <reason>", writes the flight record (work_dir/flight/rank<N>.json) and
// ends the process with `code` at once, whatever other threads are blocked in.
[[noreturn]] void exit_with_record(const std::string& reason, int code);

// c10::Error's message without the C++ backtrace it carries; any other exception's what().
std::string short_error(const std::exception& e);

// Why this rank stops when the store host does not answer: "rank 0 (the store host at
// ADDR) stopped answering rank R (<error>): ...".
std::string store_lost_reason(const RendezvousEndpoint& endpoint, int rank, const std::exception& e);

// A heartbeat's value: the beat count and how many collectives this rank has started.
struct Beat {
  int64_t count = -1;
  int64_t collectives = -1;
};
std::string encode_beat(int64_t count, int64_t collectives);
Beat decode_beat(const std::string& value);

// "collectives started: rank 0 #12, rank 1 #12, rank 2 #11 (rank 2 is behind)", from the
// heartbeats in the store; "" when there are none. Never throws.
std::string collective_progress(c10d::Store& store, int world_size) noexcept;

// "rank 2 stopped responding (no heartbeat in 2.0 s): ..." for the ranks (not `self`)
// whose heartbeat stands still for four beats (waits up to 2 s, less when every rank
// beats); "" when all beat or the store cannot be asked. For a collective that failed:
// a rank stopped inside the collective has started as many as the others.
std::string silent_ranks(c10d::Store& store, int world_size, int self) noexcept;

class FailureWatch {
 public:
  // `rank`: the original rank (heartbeats are keyed by it).
  FailureWatch(const RendezvousEndpoint& endpoint, int rank, int world_size,
               std::chrono::milliseconds heartbeat_timeout, bool elastic = false);
  ~FailureWatch();
  FailureWatch(const FailureWatch&) = delete;
  FailureWatch& operator=(const FailureWatch&) = delete;

  void stop();
  // After a regroup: the original ranks of the group (the first of them watches).
  void set_members(std::vector<int> members);

 private:
  // What this rank knows of another's heartbeat while it watches it.
  struct Watched {
    int64_t count = -2;  // the last beat count read (-1: no beat yet; -2: not read yet)
    std::chrono::steady_clock::time_point since;  // when it last changed
  };
  // dist.elastic continue: `r` is lost; the others go on without it.
  void lose(int r, const std::string& reason);
  void run();
  // A rank watched anew: its wait counts from its last beat where the store host can tell
  // when that was (store_key_age_ms), so a rank that went silent together with the one
  // watched before it (a whole node) is found at once, not one heartbeat timeout later;
  // else from now. Its beat count is read by the check that follows.
  Watched first_look(int r, std::chrono::steady_clock::time_point now);
  // The watcher (the first member) watches every other member's heartbeat; the others
  // watch the watcher's.
  void check_heartbeats(std::map<int, Watched>& watched);

  c10::intrusive_ptr<c10d::Store> store_;
  RendezvousEndpoint endpoint_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds heartbeat_timeout_;
  bool elastic_ = false;
  std::vector<int> members_;  // guarded by mutex_
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sana::dist
