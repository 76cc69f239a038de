#include "sana/distributed/step_commit.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include "sana/distributed/store_value.h"

namespace sana::dist {

namespace {

constexpr int64_t kSeal = int64_t{1} << 40;

}  // namespace

std::optional<bool> decide_commit(c10d::Store& store, const std::string& key, int world,
                                  const std::function<bool()>& loss_declared, const std::function<void()>& check,
                                  std::chrono::milliseconds limit) {
  using store_value::bytes;
  using store_value::text;
  const std::string decision = key + "/decision";
  std::string verdict;
  if (store.add(key, 1) == world) verdict = text(store.compareSet(decision, {}, bytes("commit")));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto pause = std::chrono::microseconds(100);
  bool sealed = false;
  while (verdict.empty()) {
    if (store.check({decision})) {
      verdict = text(store.get(decision));
      break;
    }
    check();
    if (!sealed && loss_declared()) {
      sealed = true;
      const int64_t before = store.add(key, -kSeal) + kSeal;
      if (before >= 0) {  // the first seal: it alone knows whether every rank had come
        verdict = text(store.compareSet(decision, {}, bytes(before == world ? "commit" : "abort")));
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  return verdict == "commit";
}

}  // namespace sana::dist
