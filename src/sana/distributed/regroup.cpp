// dist.elastic continue: the step commit and the regroup of the survivors (runtime.h).
// Keys: the losses (keys::lost, keys::kLostCount) and the regroups ("regroup/<g>/...") live
// under the run's prefix; each generation's own keys (gathers, work, the backend's
// rendezvous, the commits) under "gen<g>/" from generation 1 on.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "sana/distributed/backend_factory.h"
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

std::string Runtime::node_key() const {
  return env_.node_rank >= 0 ? fmt::format("node {}", env_.node_rank) : fmt::format("{} {}", host_, local_address_);
}

std::vector<std::string> Runtime::member_nodes() {
  std::vector<std::string> out;
  guard_store([&] {
    for (int m : members_) {
      auto known = node_of_.find(m);
      if (known == node_of_.end()) {
        const std::string key = "node/" + std::to_string(m);
        known = node_of_.emplace(m, store_->check({key}) ? text(store_->get(key)) : "").first;
      }
      out.push_back(known->second);
    }
  });
  return out;
}

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
  poll_unless_lost([&] { return work.isCompleted(); }, what);
}

void Runtime::poll_unless_lost(const std::function<bool()>& done, const char* what) {
  // Polled: a timed wait() would end an NCCL communicator at its timeout. The pause grows
  // from 20 us, so a collective about to finish waits little longer than it takes.
  auto pause = std::chrono::microseconds(20);
  auto next_check = Clock::now() + std::chrono::milliseconds(200);
  while (!done()) {
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

void Runtime::wait_point_to_point(const std::vector<c10::intrusive_ptr<c10d::Work>>& works, const char* what) {
  // Gloo's send and receive complete only inside wait(), which cannot be polled: each is
  // waited for on a thread of its own, which an abandoned one leaves blocked until the old
  // backend's timeout (its work and buffers stay referenced until then).
  struct Waited {
    std::atomic<int> state{0};  // 0: running, 1: done, 2: failed
    std::string error;
  };
  std::vector<std::shared_ptr<Waited>> waits;
  for (const auto& work : works) {
    auto waited = std::make_shared<Waited>();
    std::thread([work, waited] {
      try {
        work->wait();
        waited->state = 1;
      } catch (const std::exception& e) {
        waited->error = e.what();
        waited->state = 2;
      }
    }).detach();
    waits.push_back(std::move(waited));
  }
  for (const auto& waited : waits) {
    poll_unless_lost([&] { return waited->state.load() != 0; }, what);
    if (waited->state.load() == 2) {
      const std::string failed = fmt::format("{} #{} failed ({})", what,
                                             FlightRecorder::process().collectives_started(), waited->error);
      throw_if_rank_lost(failed);
      throw PeerFailure(failed);
    }
  }
}

void Runtime::commit_step(int64_t step) {
  if (!elastic_ || world_ == 1) return;
  const std::string count = fmt::format("commit/{}", step);
  const auto limit = timeout() + heartbeat();
  std::optional<bool> applied;
  guard_store([&] {
    if (rank_ == 0) offer_joins(step);  // before rank 0's add: whoever sees the commit sees the offer
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
  guard_store([&] {
    const std::string offer = fmt::format("join/at/{}", step);
    joining_ = gen_store_->check({offer}) ? decode_ranks(text(gen_store_->get(offer))) : std::vector<int>{};
  });
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
      if (!store_->check({arrived(m)}) && !is_declared_lost(*store_, m)) waiting.push_back(m);
    }
    if (waiting.empty()) break;
    if (Clock::now() > deadline) {
      for (int m : waiting) {
        declare_lost(*store_, m, fmt::format("rank {} did not come to the regroup within {:.0f} s", m,
                                             std::chrono::duration<double>(limit).count()));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> next;
  std::vector<std::string> elsewhere;
  for (int m : members_) {
    if (is_declared_lost(*store_, m)) continue;
    next.push_back(m);
    const std::string at = text(store_->get(arrived(m)));
    if (at != std::to_string(position)) elsewhere.push_back(fmt::format("rank {} at step {}", m, at));
  }
  if (!elsewhere.empty()) {
    const std::string reason = fmt::format(
        "the survivors of a lost rank disagree on the last step they completed (rank {} at step {}; {}): the run "
        "cannot go on in place; restart from the last checkpoint",
        original_rank(), position, fmt::join(elsewhere, ", "));
    publish_failure(*store_, reason);
    throw PeerFailure(reason);
  }
  return fmt::format("{};{}", encode_ranks(next), store_->add(keys::kLostCount, 0));
}

std::string Runtime::await_survivors(const std::string& key, int leader) {
  const auto limit = timeout() + heartbeat() + std::chrono::seconds(10);
  const auto deadline = Clock::now() + limit;
  while (!store_->check({key})) {
    const std::string failure = published_failure(*store_);
    if (!failure.empty()) throw PeerFailure(failure);
    if (leader >= 0 && is_declared_lost(*store_, leader)) return "";  // another leads
    if (Clock::now() > deadline) {
      throw DistTimeout(fmt::format("{} did not announce the group that goes on within {:.0f} s",
                                    leader >= 0 ? fmt::format("rank {} (as started)", leader) : "the group's rank 0",
                                    std::chrono::duration<double>(limit).count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return text(store_->get(key));
}

std::vector<int> Runtime::take_members(const std::string& decision) {
  const auto split = decision.find(';');
  const std::vector<int> next = decode_ranks(decision.substr(0, split));
  const auto place = std::find(next.begin(), next.end(), original_rank());
  if (place == next.end()) {
    throw PeerFailure(fmt::format("this rank (rank {} as started) was left out of the group that goes on: it came "
                                  "to the regroup too late or was declared lost",
                                  original_rank()));
  }
  std::vector<int> left;
  for (int m : members_) {
    if (std::find(next.begin(), next.end(), m) == next.end()) left.push_back(m);
  }
  ++generation_;
  members_ = next;
  rank_ = static_cast<int>(place - next.begin());
  world_ = static_cast<int>(next.size());
  losses_seen_ = std::stoll(decision.substr(split + 1));
  joining_.clear();
  gen_store_ = c10::make_intrusive<c10d::PrefixStore>(fmt::format("gen{}/", generation_), store_);
  gather_generation_ = 0;
  if (watch_) watch_->set_members(members_);
  // The old group's threads may still sit in abandoned collectives until their timeout;
  // destroying it would wait for them, so it is left to the end of the process.
  if (backend_) (void)backend_.release();
  if (world_ > 1) create_backend();
  return left;
}

Runtime::Regrouped Runtime::admit() {
  const auto started = Clock::now();
  Regrouped out;
  out.world_before = world_;
  out.joined = joining_;
  const std::string key = fmt::format("regroup/{}/members", generation_);
  std::string decision;
  guard_store([&] {
    if (rank_ == 0) {
      std::vector<int> next = members_;
      next.insert(next.end(), joining_.begin(), joining_.end());
      decision = fmt::format("{};{}", encode_ranks(next), losses_seen_);
      store_->set(key, bytes(decision));
      for (int id : joining_) store_->set(fmt::format("join/admitted/{}", id), bytes(std::to_string(generation_)));
    } else {
      decision = await_survivors(key);
    }
  });
  take_members(decision);
  out.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return out;
}

void Runtime::offer_joins(int64_t step) {
  std::vector<int> ids;
  const int64_t asked = store_->add("join/count", 0);
  while (join_requests_read_ < asked) {
    const std::string key = fmt::format("join/request/{}", join_requests_read_ + 1);
    if (!store_->check({key})) break;  // counted, not written yet: at a later step
    ++join_requests_read_;
    std::stringstream in(text(store_->get(key)));
    std::string id, version, fingerprint;
    std::getline(in, id, '\t');
    std::getline(in, version, '\t');
    std::getline(in, fingerprint, '\t');
    // Read before by a rank 0 since lost: taken in already (or refused, or given up).
    if (store_->check({"join/admitted/" + id}) || store_->check({"join/refused/" + id})) continue;
    if (version != checks_.version || fingerprint != checks_.config_fingerprint) {
      store_->set("join/refused/" + id,
                  bytes(fmt::format("the run's rank 0 has program version {} and config fingerprint {}; the "
                                    "replacement has {} and {}: start it with the same program and config",
                                    checks_.version, checks_.config_fingerprint, version, fingerprint)));
      continue;
    }
    ids.push_back(std::stoi(id));
  }
  if (!ids.empty()) gen_store_->set(fmt::format("join/at/{}", step), bytes(encode_ranks(ids)));
}

void Runtime::join_running(const StartChecks& checks) {
  if (!elastic_) {
    throw LaunchEnvError("SANA_JOIN is set, but this run has dist.elastic: restart: only a run that goes on without "
                         "a lost rank takes in a replacement");
  }
  const int id = original_rank();
  watch_ = std::make_unique<FailureWatch>(endpoint_, id, env_.world_size, heartbeat(), elastic_);
  VisibleDevices visible{cfg_.injected_cuda_devices, cfg_.inject_cuda_devices};
  if (!visible.injected) visible = visible_cuda_devices();
  claim_ = choose_device(env_, cfg_, visible, host_);
  device_map_ = {claim_};
  if (claim_.kind == "cuda" && !visible.injected) use_cuda_device(claim_.index);
  backend_name_ = choose_backend(cfg_, claim_, nccl_available());
  const auto limit = std::chrono::milliseconds(static_cast<int64_t>(cfg_.max_rejoin_wait_s * 1000));
  std::string generation;
  guard_store([&] {
    store_->set("node/" + std::to_string(id), bytes(node_key()));
    const int64_t n = store_->add("join/count", 1);
    store_->set(fmt::format("join/request/{}", n),
                bytes(fmt::format("{}\t{}\t{}\t{} pid {}", id, checks.version, checks.config_fingerprint, host_,
                                  getpid())));
    const std::string admitted = fmt::format("join/admitted/{}", id), refused = fmt::format("join/refused/{}", id);
    const auto deadline = Clock::now() + limit;
    while (!store_->check({admitted})) {
      if (store_->check({refused})) throw Disagreement(text(store_->get(refused)));
      if (store_->check({"join/closed"})) throw RunEnded("the run ended before this replacement was taken in");
      const std::string failure = published_failure(*store_);
      if (!failure.empty()) throw PeerFailure(failure);
      if (Clock::now() > deadline) {
        throw DistTimeout(fmt::format("this replacement (id {}) was not taken in within {:.0f} s "
                                      "(dist.max_rejoin_wait_s): the run is not stepping, or has ended",
                                      id, cfg_.max_rejoin_wait_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    generation = text(store_->get(admitted));
    generation_ = std::stoi(generation);
    members_.clear();  // nothing of an earlier group is this rank's
    losses_seen_ = store_->add(keys::kLostCount, 0);
    take_members(await_survivors(fmt::format("regroup/{}/members", generation_)));
  });
  log::info("taken into the run as rank {} of {} (replacement id {}, generation {})", rank_, world_, id, generation_);
}

Runtime::Regrouped Runtime::regroup(int64_t position) {
  const auto started = Clock::now();
  Regrouped out;
  out.world_before = world_;
  const std::string base = fmt::format("regroup/{}/", generation_);
  std::string decision;  // "<original ranks going on>;<losses declared so far>"
  guard_store([&] {
    store_->set(base + "arrived/" + std::to_string(original_rank()), bytes(std::to_string(position)));
    // The first member not declared lost leads; should it be lost meanwhile (a store our
    // launcher hosts outlives rank 0), the next one takes over. The first decision stands.
    while (decision.empty()) {
      const auto leader = std::find_if(members_.begin(), members_.end(),
                                       [&](int m) { return !is_declared_lost(*store_, m); });
      if (leader == members_.end()) throw PeerFailure("every member of the group was declared lost");
      if (*leader == original_rank()) {
        decision = text(store_->compareSet(base + "members", {}, bytes(decide_survivors(base, position))));
      } else {
        decision = await_survivors(base + "members", *leader);
      }
    }
  });
  out.lost = take_members(decision);
  for (int r : out.lost) tell_launcher(fmt::format("lost {}", r));  // a hung one is killed by its launcher
  out.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return out;
}

}  // namespace sana::dist
