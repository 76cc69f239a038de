#include "sana/distributed/flight_recorder.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/util/exit_codes.h"

namespace sana::dist {

namespace {

std::atomic<bool> g_dump_requested{false};

extern "C" void on_sigusr1(int) { g_dump_requested.store(true); }

const char* family_name(OpFamily f) { return f == OpFamily::collective ? "collective" : "store"; }

nlohmann::ordered_json entry_json(const FlightEntry& e, double now_s) {
  nlohmann::ordered_json j;  // in this order: what a reader scans for first comes first
  j["seq"] = e.seq;
  j["family"] = family_name(e.family);
  j["kind"] = e.kind;
  if (!e.what.empty()) j["what"] = e.what;
  j["bytes"] = e.bytes;
  if (e.repeats > 1) j["repeats"] = e.repeats;
  j["start_s"] = std::round(e.start_s * 1000) / 1000;
  if (e.end_s < 0) {
    j["state"] = "in flight";
    j["waited_s"] = std::round((now_s - e.start_s) * 1000) / 1000;
  } else {
    j["state"] = e.error.empty() ? "done" : "failed";
    j["end_s"] = std::round(e.end_s * 1000) / 1000;
  }
  if (e.limit_s > 0) j["limit_s"] = e.limit_s;
  if (!e.error.empty()) j["error"] = e.error;
  return j;
}

}  // namespace

FlightRecorder::FlightRecorder()
    : started_(Clock::now()), started_wall_(std::chrono::system_clock::now()) {}

FlightRecorder::~FlightRecorder() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

FlightRecorder& FlightRecorder::process() {
  static FlightRecorder* recorder = new FlightRecorder();  // lives until _exit
  return *recorder;
}

void FlightRecorder::set_identity(int rank, int world_size, const std::string& dir) {
  std::lock_guard<std::mutex> lock(mutex_);
  rank_ = rank;
  world_size_ = world_size;
  dir_ = dir;
}

double FlightRecorder::seconds_since_start(Clock::time_point t) const {
  return std::chrono::duration<double>(t - started_).count();
}

int64_t FlightRecorder::begin(OpFamily family, std::string kind, std::string what, int64_t bytes,
                              std::chrono::milliseconds limit, bool keep) {
  const auto now = Clock::now();
  Open op;
  op.entry.family = family;
  op.entry.kind = std::move(kind);
  op.entry.what = std::move(what);
  op.entry.bytes = bytes;
  op.entry.start_s = seconds_since_start(now);
  op.has_deadline = limit.count() > 0 && limit < kLongest;
  op.entry.limit_s = op.has_deadline ? std::chrono::duration<double>(limit).count() : 0;
  if (op.has_deadline) op.deadline = now + limit;
  op.keep = keep;
  std::lock_guard<std::mutex> lock(mutex_);
  op.entry.seq = family == OpFamily::collective ? ++collectives_ : ++store_seq_;
  const int64_t token = next_token_++;
  open_.emplace(token, std::move(op));
  return token;
}

void FlightRecorder::arm(int64_t token, std::chrono::milliseconds limit) {
  if (limit.count() <= 0 || limit >= kLongest) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(token);
  if (it == open_.end()) return;
  it->second.has_deadline = true;
  it->second.deadline = Clock::now() + limit;
  // Reported from its start: the wait began later than that.
  it->second.entry.limit_s =
      std::chrono::duration<double>(it->second.deadline - started_).count() - it->second.entry.start_s;
}

bool FlightRecorder::merge_repeat(const FlightEntry& e) {
  if (e.family != OpFamily::store || !e.error.empty()) return false;
  // The last few finished store operations, back to the latest collective.
  int looked = 0;
  for (auto it = kept_.rbegin(); it != kept_.rend() && looked < 4; ++it, ++looked) {
    if (it->family != OpFamily::store) return false;
    if (it->kind == e.kind && it->what == e.what && it->error.empty()) {
      it->end_s = e.end_s;
      ++it->repeats;
      return true;
    }
  }
  return false;
}

void FlightRecorder::end(int64_t token, const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(token);
  if (it == open_.end()) return;
  // A failed operation is always kept: it is what the record is read for.
  if (it->second.keep || !error.empty()) {
    FlightEntry e = std::move(it->second.entry);
    e.end_s = seconds_since_start(Clock::now());
    e.error = error;
    if (!merge_repeat(e)) {
      kept_.push_back(std::move(e));
      if (kept_.size() > kKept) kept_.pop_front();
    }
  }
  open_.erase(it);
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FlightEntry> out(kept_.begin(), kept_.end());
  for (const auto& [token, op] : open_) out.push_back(op.entry);
  std::stable_sort(out.begin(), out.end(),
                   [](const FlightEntry& a, const FlightEntry& b) { return a.start_s < b.start_s; });
  return out;
}

std::string FlightRecorder::to_json(const std::string& reason) const {
  const double now_s = seconds_since_start(Clock::now());
  const auto ops = entries();
  int rank = 0, world = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rank = rank_;
    world = world_size_;
  }
  // One field per line and one operation per line: readable with `less`, parsable as JSON.
  std::string out = "{\n";
  out += fmt::format("  \"rank\": {},\n  \"world_size\": {},\n  \"pid\": {},\n", rank, world, getpid());
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;  // bad UTF-8 in a message
  out += fmt::format("  \"reason\": {},\n", nlohmann::json(reason).dump(-1, ' ', false, kReplace));
  out += fmt::format("  \"process_start\": \"{:%Y-%m-%dT%H:%M:%S}Z\",\n",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(started_wall_)));
  out += fmt::format("  \"written_at_s\": {:.3f},\n", now_s);
  out += fmt::format("  \"collectives_started\": {},\n", collectives_started());
  out += "  \"ops\": [";
  for (size_t i = 0; i < ops.size(); ++i) {
    out += (i == 0 ? "\n    " : ",\n    ") + entry_json(ops[i], now_s).dump(-1, ' ', false, kReplace);
  }
  out += ops.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

std::string FlightRecorder::dump(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> writing(dump_mutex_);
    std::string dir;
    int rank = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      dir = dir_;
      rank = rank_;
    }
    if (dir.empty()) return "";
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path path = fs::path(dir) / fmt::format("rank{}.json", rank);
    const fs::path tmp = fs::path(dir) / fmt::format(".rank{}.json.tmp", rank);
    {
      std::ofstream f(tmp);
      f << to_json(reason);
      if (!f.flush()) return "";
    }
    fs::rename(tmp, path, ec);
    return ec ? "" : path.string();
  } catch (const std::exception&) {
    return "";
  }
}

std::pair<std::string, int> describe_overdue(const FlightEntry& e, const OverdueContext& c) {
  const std::string op = e.what.empty() ? fmt::format("a store {}", e.kind)
                                        : fmt::format("a store {} of '{}'", e.kind, e.what);
  if (e.family == OpFamily::store && c.hosts_store) {
    return {fmt::format("rank {}: this rank's own store at {} has not answered {} for {:.0f} s", c.rank,
                        c.store_address, op, e.limit_s),
            kExitFailure};
  }
  if (e.family == OpFamily::store) {
    return {fmt::format("{} (the store host at {}) has not answered {} for {:.0f} s: {} is stopped, hung "
                        "or cut off from rank {}",
                        c.store_host, c.store_address, op, e.limit_s, c.store_host, c.rank),
            kExitPeerFailed};
  }
  return {fmt::format("collective #{} ({}, {} bytes) has not finished after {:.0f} s (dist.timeout_s {:g}) "
                      "on rank {}: another rank is stopped, hung or cut off",
                      e.seq, e.kind, e.bytes, e.limit_s, c.timeout_s, c.rank),
          kExitPeerFailed};
}

void FlightRecorder::set_overdue_handler(OverdueHandler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  handler_ = std::move(handler);
}

void FlightRecorder::start_watchdog(std::chrono::milliseconds period) {
  std::lock_guard<std::mutex> lock(mutex_);
  period_ = period;
  if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
}

void FlightRecorder::install_sigusr1() {
  static_assert(std::atomic<bool>::is_always_lock_free, "the SIGUSR1 handler only stores a flag");
  process().start_watchdog();
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
}

void FlightRecorder::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, period_, [this] { return stopping_; });
    if (stopping_) break;
    if (this == &process() && g_dump_requested.exchange(false)) {
      lock.unlock();
      const std::string path = dump("SIGUSR1");
      std::fprintf(stderr, "flight record written to %s (SIGUSR1)\n",
                   path.empty() ? "nowhere (no work_dir)" : path.c_str());
      lock.lock();
    }
    const auto now = Clock::now();
    for (auto& [token, op] : open_) {
      if (!op.has_deadline || now < op.deadline) continue;
      op.has_deadline = false;  // reported once
      const FlightEntry overdue = op.entry;
      OverdueHandler handler = handler_;
      lock.unlock();
      if (handler) handler(overdue);
      lock.lock();
      break;  // open_ may have changed meanwhile
    }
  }
}

}  // namespace sana::dist
