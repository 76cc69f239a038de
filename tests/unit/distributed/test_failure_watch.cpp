// The failure protocol's diagnoses from the heartbeats in the store: which rank stands
// still when a collective failed (every rank had started as many collectives: one
// stopped inside the collective has started it too).
#include "catch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "sana/distributed/failure_watch.h"
#include "sana/distributed/runtime.h"
#include "sana/distributed/store_server.h"

using namespace sana::dist;
using namespace std::chrono_literals;

namespace {

void set_beat(c10d::Store& store, int rank, int64_t count, int64_t collectives) {
  const std::string v = encode_beat(count, collectives);
  store.set(keys::heartbeat(rank), std::vector<uint8_t>(v.begin(), v.end()));
}

// Beats for `ranks` every 100 ms (as a live rank's failure watch does) until destroyed.
class Beating {
 public:
  Beating(c10d::Store& store, std::vector<int> ranks) : thread_([&store, ranks, this] {
      for (int64_t n = 1; !stop_; ++n) {
        for (int r : ranks) set_beat(store, r, n, 7);
        std::this_thread::sleep_for(100ms);
      }
    }) {}
  ~Beating() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a rank whose heartbeat stands still is named, ranks that beat are not") {
  c10d::HashStore store;
  for (int r = 0; r < 3; ++r) set_beat(store, r, 1, 7);
  Beating beating(store, {1});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string silent = silent_ranks(store, 3, /*self=*/0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(silent);
  CHECK(silent.find("rank 2 stopped responding (no heartbeat in 2.0 s)") != std::string::npos);
  CHECK(silent.find("rank 1") == std::string::npos);
  CHECK(silent.find("rank 0") == std::string::npos);  // itself: its own beat is not asked for
  CHECK(secs < 3.0);
  // Every rank in the collective had started #7: the counts alone name nobody.
  CHECK(collective_progress(store, 3).find("behind") == std::string::npos);
}

TEST_CASE("no rank is named when all beat or the silent one has finished, without waiting the window") {
  c10d::HashStore store;
  for (int r = 0; r < 3; ++r) set_beat(store, r, 1, 7);
  store.set(keys::finished(2), {'1'});
  Beating beating(store, {0, 1});
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(silent_ranks(store, 3, /*self=*/1).empty());
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
}

TEST_CASE("a silent rank found by several watchers is declared lost once") {
  // dist.elastic continue: when the watcher itself goes silent, every other rank finds it
  // so; the loss must count once, or the survivors would wait for a second one.
  c10d::HashStore store;
  std::atomic<int> declared{0};
  std::vector<std::thread> watchers;
  for (int w = 0; w < 4; ++w) {
    watchers.emplace_back([&] {
      if (declare_lost(store, 0, "rank 0 stopped responding")) ++declared;
    });
  }
  for (auto& t : watchers) t.join();
  CHECK(declared.load() == 1);
  CHECK(store.add(keys::kLostCount, 0) == 1);
  const auto why = store.get(keys::lost(0));
  CHECK(std::string(why.begin(), why.end()) == "rank 0 stopped responding");
  CHECK_FALSE(declare_lost(store, 0, "again"));
  CHECK(declare_lost(store, 2, "rank 2 stopped responding"));
  CHECK(store.add(keys::kLostCount, 0) == 2);
}

TEST_CASE("ranks that went silent together are declared lost together, not a heartbeat timeout apart") {
  // dist.elastic continue with the store outside every rank (our launcher hosts it): ranks 0
  // and 1, a whole node, stopped beating at the same moment. Rank 2 watches rank 0 (the
  // watcher) and declares it lost after the heartbeat timeout; then it watches rank 1, whose
  // silence it has not timed itself, and judges it at once from when the store host last
  // heard from it (not after another timeout: 8 GPUs of a node would take 8 of them).
  StoreServerOptions o;
  o.bind_host = "127.0.0.1";
  o.token = "0123456789abcdef";
  StoreServer server(o);
  RendezvousEndpoint e;
  e.host = "127.0.0.1";
  e.port = server.port();
  e.launcher_hosts = true;
  e.run_id = "node-lost";
  e.token = o.token;
  auto store = open_store(e, 5s, 5s);
  REQUIRE(store_key_age_ms(*store, e, keys::heartbeat(0)) == -1);
  set_beat(*store, 0, 1, 3);  // their last beats
  set_beat(*store, 1, 1, 3);
  const auto age = store_key_age_ms(*store, e, keys::heartbeat(1));  // the run's key, as the prefix makes it
  REQUIRE(age.has_value());
  CHECK(*age >= 0);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto timeout = 2000ms;
  Clock::time_point lost0{}, lost1{};
  {
    FailureWatch watch(e, /*rank=*/2, /*world_size=*/3, timeout, /*elastic=*/true);
    while (Clock::now() - t0 < 10s && lost1 == Clock::time_point{}) {
      const auto now = Clock::now();
      if (lost0 == Clock::time_point{} && is_declared_lost(*store, 0)) lost0 = now;
      if (lost1 == Clock::time_point{} && is_declared_lost(*store, 1)) lost1 = now;
      std::this_thread::sleep_for(10ms);  // polling for the condition, bounded above
    }
  }
  REQUIRE(lost0 != Clock::time_point{});
  REQUIRE(lost1 != Clock::time_point{});
  const double first = std::chrono::duration<double>(lost0 - t0).count();
  const double apart = std::chrono::duration<double>(lost1 - lost0).count();
  INFO("rank 0 declared after " << first << " s, rank 1 " << apart << " s later");
  CHECK(first >= 1.9);   // the watcher's own loss waits for the whole timeout
  CHECK(apart < 1.5);    // one beat later (0.5 s), not another 2 s timeout
  const auto why = store->get(keys::lost(1));
  CHECK(std::string(why.begin(), why.end()).find("rank 1 stopped responding") != std::string::npos);
}
