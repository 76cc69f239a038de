// dist.elastic continue's step commit (distributed/step_commit.h): through one store, the
// ranks of a group that lose a member at any moment all read the same verdict, and a step
// the lost rank never reached is applied by nobody.
#include "catch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "sana/distributed/step_commit.h"

using namespace sana::dist;
using namespace std::chrono_literals;

namespace {

// `ranks` threads decide step `key`; the loss is declared once `lost` is set.
std::vector<int> decide_all(c10d::Store& store, const std::string& key, int world, int ranks,
                            const std::atomic<bool>& lost) {
  std::vector<int> verdicts(static_cast<size_t>(ranks), -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      const auto v = decide_commit(store, key, world, [&] { return lost.load(); }, [] {}, 10s);
      verdicts[static_cast<size_t>(r)] = v ? static_cast<int>(*v) : 2;
    });
  }
  for (auto& t : threads) t.join();
  return verdicts;
}

}  // namespace

TEST_CASE("step commit: a step every rank reaches is applied by all") {
  c10d::HashStore store;
  std::atomic<bool> lost{false};
  CHECK(decide_all(store, "commit/1", 4, 4, lost) == std::vector<int>{1, 1, 1, 1});
}

TEST_CASE("step commit: a step the lost rank never reached is applied by nobody, a late survivor neither") {
  c10d::HashStore store;
  std::atomic<bool> lost{false};
  std::thread declare([&] {
    std::this_thread::sleep_for(50ms);
    lost = true;
  });
  CHECK(decide_all(store, "commit/7", 4, 3, lost) == std::vector<int>{0, 0, 0});
  declare.join();
  const auto late = decide_commit(store, "commit/7", 4, [] { return true; }, [] {}, 1s);
  REQUIRE(late.has_value());
  CHECK_FALSE(*late);
}

TEST_CASE("step commit: however the loss and the lost rank's last add interleave, every survivor reads one verdict") {
  std::mt19937 random(47);
  int commits = 0, aborts = 0;
  for (int trial = 0; trial < 150; ++trial) {
    c10d::HashStore store;
    const std::string key = "commit/" + std::to_string(trial);
    std::atomic<bool> lost{false};
    // 0: the lost rank added before dying (the step is applied unless the loss is declared
    // before every survivor has added); 1: it never did; 2: it adds while the others wait.
    const int kind = trial % 3;
    if (kind == 0) store.add(key, 1);
    const auto add_after = std::chrono::microseconds(random() % 3000);
    const auto loss_after = std::chrono::microseconds(random() % 3000 + (kind == 0 ? 3000 : 0));
    std::thread dying([&] {
      if (kind != 2) return;
      std::this_thread::sleep_for(add_after);
      store.add(key, 1);
    });
    std::thread declare([&] {
      std::this_thread::sleep_for(loss_after);
      lost = true;
    });
    const auto verdicts = decide_all(store, key, 4, 3, lost);
    dying.join();
    declare.join();
    INFO("trial " << trial << ": " << verdicts[0] << verdicts[1] << verdicts[2]);
    REQUIRE(verdicts[0] != 2);
    CHECK(verdicts[1] == verdicts[0]);
    CHECK(verdicts[2] == verdicts[0]);
    if (kind == 1) CHECK(verdicts[0] == 0);
    (verdicts[0] == 1 ? commits : aborts) += 1;
  }
  CHECK(commits >= 10);  // both verdicts came up
  CHECK(aborts >= 50);
}
