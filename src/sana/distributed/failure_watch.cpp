#include "sana/distributed/failure_watch.h"

#include <fmt/format.h>

#include <cstdlib>

#include "sana/distributed/runtime.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

constexpr std::chrono::milliseconds kBeat{500};

}  // namespace

void publish_failure(c10d::Store& store, const std::string& reason) noexcept {
  try {
    if (store.add(keys::kFailedCount, 1) == 1) store.set(keys::kFailed, bytes(reason));
  } catch (const std::exception&) {
    // The store is gone: the other ranks learn of the failure from that.
  }
}

std::string published_failure(c10d::Store& store) {
  if (!store.check({keys::kFailed})) return "";
  return text(store.get(keys::kFailed));
}

std::string published_failure_or_empty(c10d::Store& store) noexcept {
  try {
    return published_failure(store);
  } catch (const std::exception&) {
    return "";
  }
}

void wait_for_acks(c10d::Store& store, int world_size, std::chrono::milliseconds grace,
                   int dead_rank) noexcept {
  // A rank is through when it acknowledged or finished; one whose heartbeat stands still
  // for three beats is gone (killed), and waiting for it would only delay the others.
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + grace;
  std::vector<std::string> last(static_cast<size_t>(world_size));
  std::vector<Clock::time_point> since(static_cast<size_t>(world_size), Clock::now());
  try {
    for (int r = 1; r < world_size; ++r) {
      if (r == dead_rank) continue;
      const auto i = static_cast<size_t>(r);
      while (!store.check({keys::ack(r)}) && !store.check({keys::finished(r)})) {
        const auto now = Clock::now();
        if (now > deadline) return;
        const std::string beat =
            store.check({keys::heartbeat(r)}) ? text(store.get(keys::heartbeat(r))) : "";
        if (beat != last[i]) {
          last[i] = beat;
          since[i] = now;
        } else if (now - since[i] > 3 * kBeat) {
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception&) {
  }
}

void exit_for_peer_failure(c10d::Store* store, int rank, int world_size,
                           const std::string& reason, int dead_rank) {
  log::error("stopping: {}", reason);
  if (store != nullptr) {
    try {
      store->set(keys::ack(rank), bytes("1"));
      if (rank == 0) wait_for_acks(*store, world_size, std::chrono::seconds(5), dead_rank);
    } catch (const std::exception&) {
    }
  }
  log::close_file();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kExitPeerFailed);
}

FailureWatch::FailureWatch(const RendezvousEndpoint& endpoint, int rank, int world_size,
                           std::chrono::milliseconds heartbeat_timeout,
                           std::chrono::milliseconds timeout)
    : rank_(rank), world_size_(world_size), heartbeat_timeout_(heartbeat_timeout) {
  RendezvousEndpoint client = endpoint;
  client.server = false;
  store_ = open_store(client, timeout);
  thread_ = std::thread([this] { run(); });
}

FailureWatch::~FailureWatch() { stop(); }

void FailureWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FailureWatch::run() {
  std::vector<int64_t> last(static_cast<size_t>(world_size_), -1);
  std::vector<std::chrono::steady_clock::time_point> since(static_cast<size_t>(world_size_),
                                                           std::chrono::steady_clock::now());
  int64_t beat = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    try {
      store_->set(keys::heartbeat(rank_), bytes(std::to_string(++beat)));
      const std::string failure = published_failure(*store_);
      if (!failure.empty()) {
        exit_for_peer_failure(store_.get(), rank_, world_size_, failure);
      }
      if (rank_ == 0) check_heartbeats(last, since);
    } catch (const std::exception& e) {
      lock.lock();
      if (stopping_) break;
      exit_for_peer_failure(nullptr, rank_, world_size_,
                            fmt::format("lost the connection to the store on rank 0 ({}); rank 0 "
                                        "has probably failed",
                                        e.what()));
    }
    lock.lock();
    wake_.wait_for(lock, kBeat, [this] { return stopping_; });
  }
}

void FailureWatch::check_heartbeats(std::vector<int64_t>& last,
                                    std::vector<std::chrono::steady_clock::time_point>& since) {
  const auto now = std::chrono::steady_clock::now();
  for (int r = 1; r < world_size_; ++r) {
    const auto i = static_cast<size_t>(r);
    if (store_->check({keys::finished(r)})) continue;
    int64_t value = -1;
    if (store_->check({keys::heartbeat(r)})) value = std::atoll(text(store_->get(keys::heartbeat(r))).c_str());
    if (value != last[i]) {
      last[i] = value;
      since[i] = now;
      continue;
    }
    if (now - since[i] > heartbeat_timeout_) {
      const double secs = std::chrono::duration<double>(now - since[i]).count();
      const std::string reason = fmt::format(
          "rank {} stopped responding (no heartbeat for {:.0f} s): it was killed, crashed or hung",
          r, secs);
      publish_failure(*store_, reason);
      exit_for_peer_failure(store_.get(), rank_, world_size_, published_failure(*store_), r);
    }
  }
}

}  // namespace sana::dist
