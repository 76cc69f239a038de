// dist.elastic continue: the step commit and the regroup of the survivors (runtime.h).
// Keys: the losses (keys::lost, keys::kLostCount) and the regroups ("regroup/<g>/...") live
// under the run's prefix; each generation's own keys (gathers, work, the backend's
// rendezvous, the commits) under "gen<g>/" from generation 1 on.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <sstream>
#include <thread>

#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/launcher_link.h"
#include "sana/distributed/runtime.h"
#include "sana/distributed/step_commit.h"
#include "sana/distributed/store_value.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

using store_value::bytes;
using store_value::text;
using Clock = std::chrono::steady_clock;

std::string encode_ranks(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }

std::vector<int> decode_ranks(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

}  // namespace

bool Runtime::loss_pending() { return store_->add(keys::kLostCount, 0) > losses_seen_; }

std::string Runtime::lost_reasons() {
  std::vector<std::string> reasons;
  for (int r : members_) {
    if (store_->check({keys::lost(r)})) reasons.push_back(text(store_->get(keys::lost(r))));
  }
  return fmt::format("{}", fmt::join(reasons, "; "));
}

void Runtime::throw_if_rank_lost(const std::string& what) {
  // Rank 0 declares a silent rank lost after the heartbeat timeout: a collective that
  // failed at once (a peer's socket closed) waits that long for the verdict.
  const auto deadline = Clock::now() + heartbeat() + std::chrono::seconds(3);
  try {
    while (Clock::now() < deadline) {
      if (loss_pending()) throw RankLost(fmt::format("{}: {}", what, lost_reasons()));
      if (!published_failure(*store_).empty()) return;  // an ordinary failure: the caller says it
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const RankLost&) {
    throw;
  } catch (const std::exception&) {
    // The store is gone: not a loss the survivors can go on from.
  }
}

void Runtime::wait_unless_lost(c10d::Work& work, const char* what) {
  // Polled: a timed wait() would end an NCCL communicator at its timeout. The pause grows
  // from 20 us, so a collective about to finish waits little longer than it takes.
  auto pause = std::chrono::microseconds(20);
  auto next_check = Clock::now() + std::chrono::milliseconds(200);
  while (!work.isCompleted()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
    if (Clock::now() < next_check) continue;
    next_check = Clock::now() + std::chrono::milliseconds(200);
    if (loss_pending()) {
      throw RankLost(fmt::format("{} #{} abandoned: {}", what, FlightRecorder::process().collectives_started(),
                                 lost_reasons()));
    }
  }
}

void Runtime::commit_step(int64_t step) {
  if (!elastic_ || world_ == 1) return;
  const std::string count = fmt::format("commit/{}", step);
  const auto limit = timeout() + heartbeat();
  std::optional<bool> applied;
  guard_store([&] {
    applied = decide_commit(*gen_store_, count, world_, [this] { return loss_pending(); },
                            [this] {
                              const std::string failure = published_failure(*store_);
                              if (!failure.empty()) throw PeerFailure(failure);
                            },
                            limit);
  });
  if (!applied) {
    throw DistTimeout(fmt::format("the commit of step {} waited {:.0f} s for the other ranks", step,
                                  std::chrono::duration<double>(limit).count()));
  }
  if (rank_ == 0 && step > 2) {  // every rank is past step - 2's commit: its keys go
    try {
      gen_store_->deleteKey(fmt::format("commit/{}", step - 2));
      gen_store_->deleteKey(fmt::format("commit/{}/decision", step - 2));
    } catch (const std::exception&) {
    }
  }
  if (!*applied) {
    throw RankLost(fmt::format("step {} was interrupted by the loss of a rank: no survivor applies it", step));
  }
}

std::string Runtime::decide_survivors(const std::string& base, int64_t position) {
  // Everyone still beating comes here once its own collective has failed or was abandoned;
  // the silent are declared lost by the failure watch (or here, at the deadline).
  const auto limit = timeout() + heartbeat() + std::chrono::seconds(5);
  const auto deadline = Clock::now() + limit;
  const auto arrived = [&](int m) { return base + "arrived/" + std::to_string(m); };
  for (;;) {
    std::vector<int> waiting;
    for (int m : members_) {
      if (!store_->check({arrived(m)}) && !store_->check({keys::lost(m)})) waiting.push_back(m);
    }
    if (waiting.empty()) break;
    if (Clock::now() > deadline) {
      for (int m : waiting) {
        store_->set(keys::lost(m), bytes(fmt::format("rank {} did not come to the regroup within {:.0f} s", m,
                                                     std::chrono::duration<double>(limit).count())));
        store_->add(keys::kLostCount, 1);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> next;
  std::vector<std::string> elsewhere;
  for (int m : members_) {
    if (store_->check({keys::lost(m)})) continue;
    next.push_back(m);
    const std::string at = text(store_->get(arrived(m)));
    if (at != std::to_string(position)) elsewhere.push_back(fmt::format("rank {} at step {}", m, at));
  }
  if (!elsewhere.empty()) {
    const std::string reason = fmt::format(
        "the survivors of a lost rank disagree on the last step they completed (rank 0 at step {}; {}): the run "
        "cannot go on in place; restart from the last checkpoint",
        position, fmt::join(elsewhere, ", "));
    publish_failure(*store_, reason);
    throw PeerFailure(reason);
  }
  return fmt::format("{};{}", encode_ranks(next), store_->add(keys::kLostCount, 0));
}

std::string Runtime::await_survivors(const std::string& key) {
  const auto limit = timeout() + heartbeat() + std::chrono::seconds(10);
  const auto deadline = Clock::now() + limit;
  while (!store_->check({key})) {
    const std::string failure = published_failure(*store_);
    if (!failure.empty()) throw PeerFailure(failure);
    if (Clock::now() > deadline) {
      throw DistTimeout(fmt::format("rank 0 did not decide who goes on after the loss of a rank within {:.0f} s",
                                    std::chrono::duration<double>(limit).count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return text(store_->get(key));
}

Runtime::Regrouped Runtime::regroup(int64_t position) {
  const auto started = Clock::now();
  Regrouped out;
  out.world_before = world_;
  const std::string base = fmt::format("regroup/{}/", generation_);
  std::string decision;  // "<original ranks going on>;<losses declared so far>"
  guard_store([&] {
    store_->set(base + "arrived/" + std::to_string(original_rank()), bytes(std::to_string(position)));
    if (rank_ == 0) {
      decision = decide_survivors(base, position);
      store_->set(base + "members", bytes(decision));
    } else {
      decision = await_survivors(base + "members");
    }
  });
  const auto split = decision.find(';');
  const std::vector<int> next = decode_ranks(decision.substr(0, split));
  const auto place = std::find(next.begin(), next.end(), original_rank());
  if (place == next.end()) {
    throw PeerFailure(fmt::format("this rank (rank {} as started) was left out of the group that goes on: it came "
                                  "to the regroup too late or was declared lost",
                                  original_rank()));
  }
  for (int m : members_) {
    if (std::find(next.begin(), next.end(), m) == next.end()) out.lost.push_back(m);
  }
  ++generation_;
  members_ = next;
  rank_ = static_cast<int>(place - next.begin());
  world_ = static_cast<int>(next.size());
  losses_seen_ = std::stoll(decision.substr(split + 1));
  gen_store_ = c10::make_intrusive<c10d::PrefixStore>(fmt::format("gen{}/", generation_), store_);
  gather_generation_ = 0;
  if (watch_) watch_->set_members(members_);
  // The old group's threads may still sit in abandoned collectives until their timeout;
  // destroying it would wait for them, so it is left to the end of the process.
  if (backend_) (void)backend_.release();
  if (world_ > 1) create_backend();
  for (int r : out.lost) tell_launcher(fmt::format("lost {}", r));  // a hung one is killed by its launcher
  out.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return out;
}

}  // namespace sana::dist
