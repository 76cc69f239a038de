// The watched store: every operation lands in the process's flight record, and one that
// its store leaves unanswered (a stopped store host: the calling thread sits in a read
// with no timeout of its own) is reported by the watchdog at its limit.
#include "catch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/watched_store.h"

using namespace sana::dist;
using namespace std::chrono_literals;

namespace {

// A store whose check() does not answer until released (or 10 s, so no test can hang).
class StalledStore : public c10d::HashStore {
 public:
  bool check(const std::vector<std::string>& keys) override {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, 10s, [&] { return released_; });
    return HashStore::check(keys);
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(m_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool released_ = false;
};

}  // namespace

// Puts back an empty overdue handler however the test ends (ours captures locals).
struct HandlerGuard {
  ~HandlerGuard() { FlightRecorder::process().set_overdue_handler(nullptr); }
};

TEST_CASE("a store operation left unanswered is reported at its limit, answered ones are recorded") {
  auto& rec = FlightRecorder::process();
  std::mutex m;
  std::vector<FlightEntry> overdue;
  HandlerGuard restore;
  rec.set_overdue_handler([&](const FlightEntry& e) {
    std::lock_guard<std::mutex> lock(m);
    overdue.push_back(e);
  });
  rec.start_watchdog();
  auto inner = c10::make_intrusive<StalledStore>();
  WatchedStore store(inner, 200ms);

  store.set("hb/1", std::vector<uint8_t>{'7'});
  CHECK(store.get("hb/1") == std::vector<uint8_t>{'7'});
  CHECK(store.add("count", 2) == 2);
  const auto ops = rec.entries();
  REQUIRE(ops.size() >= 3);
  CHECK(ops[ops.size() - 3].kind == "set");
  CHECK(ops[ops.size() - 3].what == "hb/1");
  CHECK(ops[ops.size() - 3].bytes == 1);
  CHECK(ops[ops.size() - 2].kind == "get");
  CHECK(ops.back().kind == "add");

  const auto start = std::chrono::steady_clock::now();
  std::thread caller([&] { store.check({"failed"}); });
  const auto deadline = start + 5s;
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    std::lock_guard<std::mutex> lock(m);
    seen = !overdue.empty();
  }
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  inner->release();
  caller.join();
  REQUIRE(seen);
  CHECK(after >= 0.2);
  CHECK(after < 3.0);
  CHECK(overdue.front().kind == "check");
  CHECK(overdue.front().what == "failed");
  CHECK(overdue.front().limit_s == Approx(0.2));
}
