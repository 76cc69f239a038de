// The runtime's collectives through the run's store (runtime.h): gathers, agreements and
// one rank's work the others wait for. No backend needed; every wait bounded.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "sana/distributed/failure_watch.h"
#include "sana/distributed/runtime.h"
#include "sana/distributed/store_value.h"

namespace sana::dist {

namespace {

using store_value::bytes;
using store_value::text;

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::vector<std::string> Runtime::all_gather(const std::string& name, const std::string& mine) {
  if (world_size() == 1) return {mine};
  const std::string base = fmt::format("gather/{}/{}/", gather_generation_++, name);
  std::vector<std::string> out;
  guard_store([&] {
    gen_store_->set(base + std::to_string(rank()), bytes(mine));
    std::vector<std::string> all;
    for (int r = 0; r < world_size(); ++r) all.push_back(base + std::to_string(r));
    wait_for_keys_unguarded(all, "exchanging " + name);
    for (const auto& k : all) out.push_back(text(gen_store_->get(k)));
  });
  return out;
}

void Runtime::agree(const std::string& what, const std::string& mine) {
  const auto values = all_gather("agree", mine);
  std::vector<std::pair<std::string, std::vector<int>>> holders;  // by lowest rank
  for (size_t r = 0; r < values.size(); ++r) {
    auto it = std::find_if(holders.begin(), holders.end(),
                           [&](const auto& h) { return h.first == values[r]; });
    if (it == holders.end()) it = holders.insert(holders.end(), {values[r], {}});
    it->second.push_back(static_cast<int>(r));
  }
  if (holders.size() == 1) return;
  std::vector<std::string> parts;
  for (const auto& [value, ranks] : holders) {
    parts.push_back(fmt::format("{} {}", rank_list(ranks), value));
  }
  throw Disagreement(fmt::format(
      "ranks disagree on the {}: {}. Start every rank with the same program, config and "
      "overrides",
      what, fmt::join(parts, "; ")));
}

void Runtime::work_progress(const std::string& name, int64_t count) {
  if (world_size() == 1) return;
  guard_store([&] { gen_store_->set("work/" + name + "/progress", bytes(std::to_string(count))); });
}

void Runtime::work_done(const std::string& name) {
  if (world_size() == 1) return;
  guard_store([&] { gen_store_->set("work/" + name + "/done", bytes("1")); });
}

void Runtime::wait_for_work(const std::string& name, int worker) {
  if (world_size() == 1) return;
  guard_store([&] {
    const std::string done = "work/" + name + "/done", progress = "work/" + name + "/progress";
    std::string last;
    auto deadline = std::chrono::steady_clock::now() + timeout();
    while (!gen_store_->check({done})) {
      const std::string failure = published_failure(*store_);
      if (!failure.empty()) {
        store_->set(keys::ack(original_rank()), bytes("1"));
        throw PeerFailure(failure);
      }
      if (elastic_ && loss_pending()) throw RankLost(fmt::format("a rank was lost while waiting for {}", name));
      if (gen_store_->check({progress})) {
        const std::string now = text(gen_store_->get(progress));
        if (now != last) {  // the worker is moving: a new stall deadline
          last = now;
          deadline = std::chrono::steady_clock::now() + timeout();
        }
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw DistTimeout(fmt::format("rank {} made no progress on {} for {} s (dist.timeout_s); it is stuck",
                                      worker, name, cfg_.timeout_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

std::string Runtime::broadcast_string(const std::string& value) {
  return all_gather("broadcast", rank() == 0 ? value : "").front();
}

}  // namespace sana::dist
