#include "sana/distributed/failure_watch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/store_value.h"
#include "sana/distributed/runtime.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

using store_value::bytes;
using store_value::text;

constexpr std::chrono::milliseconds kBeat{500};

}  // namespace

bool declare_lost(c10d::Store& store, int rank, const std::string& reason) {
  if (store.add(keys::lost(rank) + "/declared", 1) != 1) return false;  // the gate: is_declared_lost
  store.set(keys::lost(rank), bytes(reason));
  store.add(keys::kLostCount, 1);
  return true;
}

bool is_declared_lost(c10d::Store& store, int rank) { return store.check({keys::lost(rank) + "/declared"}); }

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

void exit_with_record(const std::string& reason, int code) {
  // The watchdog and the failure watch may both get here: the first one says why.
  static std::atomic<bool> exiting{false};
  if (exiting.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  log::error("stopping: {}", reason);
  const std::string path = FlightRecorder::process().dump(reason);
  if (!path.empty()) log::error("flight record of this rank: {}", path);
  log::close_file();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

void exit_for_peer_failure(c10d::Store* store, int rank, int world_size,
                           const std::string& reason, int dead_rank) {
  if (store != nullptr) {
    try {
      store->set(keys::ack(rank), bytes("1"));
      if (rank == 0) wait_for_acks(*store, world_size, std::chrono::seconds(5), dead_rank);
    } catch (const std::exception&) {
    }
  }
  exit_with_record(reason, kExitPeerFailed);
}

std::string short_error(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

std::string store_lost_reason(const RendezvousEndpoint& endpoint, int rank, const std::exception& e) {
  const std::string who = endpoint.host_name();
  return fmt::format("{} (the store host at {}:{}) stopped answering rank {} ({}): {} is stopped, hung, gone or "
                     "cut off",
                     who, endpoint.host, endpoint.port, rank, short_error(e), who);
}

std::string encode_beat(int64_t count, int64_t collectives) {
  return fmt::format("{} {}", count, collectives);
}

Beat decode_beat(const std::string& value) {
  Beat b;
  if (std::sscanf(value.c_str(), "%" SCNd64 " %" SCNd64, &b.count, &b.collectives) < 1) b.count = -1;
  return b;
}

std::string collective_progress(c10d::Store& store, int world_size) noexcept {
  try {
    std::vector<std::string> parts;
    std::vector<std::pair<int, int64_t>> seen;
    int64_t most = -1;
    for (int r = 0; r < world_size; ++r) {
      if (!store.check({keys::heartbeat(r)})) continue;
      const Beat b = decode_beat(text(store.get(keys::heartbeat(r))));
      if (b.collectives < 0) continue;
      seen.emplace_back(r, b.collectives);
      most = std::max(most, b.collectives);
      parts.push_back(fmt::format("rank {} #{}", r, b.collectives));
    }
    if (seen.empty()) return "";
    std::vector<std::string> behind;
    for (const auto& [r, n] : seen) {
      if (n < most) behind.push_back(fmt::format("rank {} at #{}", r, n));
    }
    return fmt::format("collectives started (as of the last heartbeats): {}{}", fmt::join(parts, ", "),
                       behind.empty() ? "" : fmt::format("; behind: {}", fmt::join(behind, ", ")));
  } catch (const std::exception&) {
    return "";
  }
}

std::string silent_ranks(c10d::Store& store, int world_size, int self) noexcept {
  // A rank that is alive beats every kBeat whatever its main thread is stuck in; one
  // whose beat count stands still for four beats is stopped, hung or gone.
  using Clock = std::chrono::steady_clock;
  const auto window = 4 * kBeat;
  try {
    std::vector<std::string> first(static_cast<size_t>(world_size));
    std::vector<bool> moved(static_cast<size_t>(world_size), false);
    const auto beat = [&](int r) {
      return store.check({keys::heartbeat(r)}) ? text(store.get(keys::heartbeat(r))) : std::string();
    };
    for (int r = 0; r < world_size; ++r) first[static_cast<size_t>(r)] = beat(r);
    moved[static_cast<size_t>(self)] = true;
    const auto start = Clock::now();
    while (Clock::now() - start < window) {
      bool all = true;
      for (int r = 0; r < world_size; ++r) {
        const auto i = static_cast<size_t>(r);
        if (moved[i]) continue;
        if (store.check({keys::finished(r)}) || beat(r) != first[i]) moved[i] = true;
        all = all && moved[i];
      }
      if (all) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::vector<std::string> silent;
    for (int r = 0; r < world_size; ++r) {
      if (!moved[static_cast<size_t>(r)]) silent.push_back(fmt::format("rank {}", r));
    }
    return fmt::format("{} stopped responding (no heartbeat in {:.1f} s): stopped, hung or gone",
                       fmt::join(silent, ", "), std::chrono::duration<double>(window).count());
  } catch (const std::exception&) {
    return "";
  }
}

FailureWatch::FailureWatch(const RendezvousEndpoint& endpoint, int rank, int world_size,
                           std::chrono::milliseconds heartbeat_timeout, bool elastic)
    : endpoint_(endpoint), rank_(rank), world_size_(world_size), heartbeat_timeout_(heartbeat_timeout),
      elastic_(elastic) {
  for (int r = 0; r < world_size; ++r) members_.push_back(r);
  RendezvousEndpoint client = endpoint;
  client.server = false;
  // Its beats are quick store operations on keys that exist: a store host that leaves one
  // unanswered for the heartbeat timeout is as good as dead (the flight recorder's
  // watchdog ends us), so that is also this connection's timeout.
  store_ = open_store(client, heartbeat_timeout, heartbeat_timeout, /*keep_in_record=*/false);
  thread_ = std::thread([this] { run(); });
}

FailureWatch::~FailureWatch() { stop(); }

void FailureWatch::set_members(std::vector<int> members) {
  std::lock_guard<std::mutex> lock(mutex_);
  members_ = std::move(members);
}

void FailureWatch::lose(int r, const std::string& reason) {
  if (declare_lost(*store_, r, reason)) log::warn("{}; the others go on without it (dist.elastic: continue)", reason);
  std::lock_guard<std::mutex> lock(mutex_);
  members_.erase(std::remove(members_.begin(), members_.end(), r), members_.end());
}

void FailureWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FailureWatch::run() {
  std::map<int, Watched> watched;  // by original rank (a replacement's id may pass the world size)
  int64_t beat = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    try {
      store_->set(keys::heartbeat(rank_),
                  bytes(encode_beat(++beat, FlightRecorder::process().collectives_started())));
      const std::string failure = published_failure(*store_);
      if (!failure.empty()) {
        exit_for_peer_failure(store_.get(), rank_, world_size_, failure);
      }
      if (elastic_ && store_->check({keys::lost(rank_)})) {  // e.g. stopped for longer than the timeout
        exit_with_record(fmt::format("this rank (rank {} as started) was declared lost and the others went on "
                                     "without it: {}",
                                     rank_, text(store_->get(keys::lost(rank_)))),
                         kExitPeerFailed);
      }
      check_heartbeats(watched);
    } catch (const std::exception& e) {
      lock.lock();
      if (stopping_) break;
      exit_for_peer_failure(nullptr, rank_, world_size_, store_lost_reason(endpoint_, rank_, e));
    }
    lock.lock();
    wake_.wait_for(lock, kBeat, [this] { return stopping_; });
  }
}

FailureWatch::Watched FailureWatch::first_look(int r, std::chrono::steady_clock::time_point now) {
  const auto age = store_key_age_ms(*store_, endpoint_, keys::heartbeat(r));
  return {-2, age && *age >= 0 ? now - std::chrono::milliseconds(*age) : now};
}

void FailureWatch::check_heartbeats(std::map<int, Watched>& watched) {
  const auto now = std::chrono::steady_clock::now();
  int watcher = 0;
  std::vector<int> ranks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (members_.empty()) return;
    watcher = members_.front();
    if (rank_ == watcher) {
      for (int m : members_) {
        if (m != rank_) ranks.push_back(m);
      }
    } else {
      ranks.push_back(watcher);
    }
  }
  std::map<int, Watched> still;
  for (int r : ranks) still[r] = watched.count(r) ? watched[r] : first_look(r, now);
  watched = std::move(still);
  for (int r : ranks) {
    Watched& w = watched[r];
    if (store_->check({keys::finished(r)})) continue;
    Beat beat;
    if (store_->check({keys::heartbeat(r)})) beat = decode_beat(text(store_->get(keys::heartbeat(r))));
    if (w.count == -2) {
      w.count = beat.count;  // the first look: its wait counts from first_look's `since`
    } else if (beat.count != w.count) {
      w.count = beat.count;
      w.since = now;
      continue;
    }
    if (now - w.since <= heartbeat_timeout_) continue;
    const double secs = std::chrono::duration<double>(now - w.since).count();
    std::string reason = fmt::format(
        "rank {} stopped responding (no heartbeat for {:.0f} s): it was killed, crashed or hung", r, secs);
    if (beat.collectives >= 0) {
      reason += fmt::format("; it had started {} collectives, rank {} {}", beat.collectives, rank_,
                            FlightRecorder::process().collectives_started());
    }
    // The watcher's own loss can be survived only where the store is not in its process.
    if (elastic_ && (rank_ == watcher || endpoint_.outlives_ranks())) {
      lose(r, reason);
      continue;
    }
    publish_failure(*store_, reason);
    exit_for_peer_failure(store_.get(), rank_, world_size_, published_failure(*store_), r);
  }
}

}  // namespace sana::dist
