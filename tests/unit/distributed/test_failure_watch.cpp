// The failure protocol's diagnoses from the heartbeats in the store: which rank stands
// still when a collective failed (every rank had started as many collectives: one
// stopped inside the collective has started it too).
#include "catch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "sana/distributed/failure_watch.h"

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
