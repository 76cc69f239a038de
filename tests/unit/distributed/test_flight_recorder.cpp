// The flight recorder without processes: what it keeps (the last 64 finished operations,
// every one in flight), its numbering, the JSON a person reads after a failure, the
// watchdog that reports an operation past its deadline (once, and never one that ended
// in time), and the message an overdue operation becomes.
#include "catch.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sana/distributed/flight_recorder.h"
#include "sana/util/exit_codes.h"
#include "test_support.h"

using namespace sana::dist;
using namespace std::chrono_literals;

namespace {

// Waits (bounded) until `done` holds; the watchdog runs on its own thread.
template <class Pred>
bool eventually(Pred done, std::chrono::milliseconds limit = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("the flight record keeps the last 64 finished operations and all in flight") {
  FlightRecorder rec;
  const int64_t stuck = rec.begin(OpFamily::store, "check", "failed", 0, 0ms);
  for (int i = 0; i < 100; ++i) {
    rec.end(rec.begin(OpFamily::collective, "all-reduce", "", 4 * i, 0ms));
  }
  const auto ops = rec.entries();
  REQUIRE(ops.size() == FlightRecorder::kKept + 1);
  // Oldest first: the stuck store operation started before all of them.
  CHECK(ops.front().kind == "check");
  CHECK(ops.front().end_s < 0);
  CHECK(ops.front().seq == 1);
  // Collectives are numbered on their own: the kept ones are #37..#100.
  CHECK(ops[1].seq == 100 - static_cast<int64_t>(FlightRecorder::kKept) + 1);
  CHECK(ops.back().seq == 100);
  CHECK(ops.back().bytes == 4 * 99);
  CHECK(rec.collectives_started() == 100);
  rec.end(stuck, "connection reset");
  CHECK(rec.entries().front().error == "connection reset");  // sorted by start
}

TEST_CASE("operations recorded with keep=false leave no trace once they end well") {
  FlightRecorder rec;
  const int64_t beat = rec.begin(OpFamily::store, "set", "hb/1", 8, 1s, /*keep=*/false);
  CHECK(rec.entries().size() == 1);  // in flight: listed
  rec.end(beat);
  CHECK(rec.entries().empty());
  // A beat that fails is what the record is read for: kept.
  rec.end(rec.begin(OpFamily::store, "set", "hb/1", 8, 1s, /*keep=*/false), "Socket Timeout");
  REQUIRE(rec.entries().size() == 1);
  CHECK(rec.entries().front().error == "Socket Timeout");
}

TEST_CASE("the JSON record parses, one operation per line, in-flight ones with their wait") {
  sana::test::TempDir dir;
  FlightRecorder rec;
  rec.set_identity(2, 3, dir.path("flight"));
  rec.end(rec.begin(OpFamily::collective, "broadcast", "", 512, 25s));
  rec.begin(OpFamily::store, "get", "gather/0/device/1", 0, 25s);
  const std::string path = rec.dump("rank 0 (the store host at 127.0.0.1:1) has not answered");
  REQUIRE(path == dir.path("flight/rank2.json"));
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  const auto j = nlohmann::json::parse(text.str());
  CHECK(j["rank"] == 2);
  CHECK(j["world_size"] == 3);
  CHECK(j["reason"] == "rank 0 (the store host at 127.0.0.1:1) has not answered");
  CHECK(j["collectives_started"] == 1);
  REQUIRE(j["ops"].size() == 2);
  CHECK(j["ops"][0]["state"] == "done");
  CHECK(j["ops"][0]["kind"] == "broadcast");
  CHECK(j["ops"][1]["state"] == "in flight");
  CHECK(j["ops"][1]["what"] == "gather/0/device/1");
  CHECK(j["ops"][1]["waited_s"].get<double>() >= 0);
  // Readable without tools: each operation on a line of its own.
  size_t op_lines = 0;
  std::istringstream lines(text.str());
  for (std::string line; std::getline(lines, line);) op_lines += line.find("\"seq\"") != std::string::npos;
  CHECK(op_lines == 2);
}

TEST_CASE("without a folder the record is not written") {
  FlightRecorder rec;
  rec.set_identity(0, 1, "");
  CHECK(rec.dump("any").empty());
}

TEST_CASE("the watchdog reports an overdue operation once, and not one that ended in time") {
  std::mutex m;
  std::vector<FlightEntry> reported;
  FlightRecorder rec;  // after what its handler uses: its watchdog stops first
  rec.set_overdue_handler([&](const FlightEntry& e) {
    std::lock_guard<std::mutex> lock(m);
    reported.push_back(e);
  });
  rec.start_watchdog(10ms);
  // Ends well within its limit: never reported.
  rec.end(rec.begin(OpFamily::store, "set", "quick", 1, 2s));
  const auto start = std::chrono::steady_clock::now();
  rec.begin(OpFamily::store, "check", "failed", 0, 150ms);
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(m);
    return !reported.empty();
  }));
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(after >= 0.15);
  CHECK(after < 2.0);
  std::this_thread::sleep_for(100ms);  // ten more watchdog rounds: still reported once
  std::lock_guard<std::mutex> lock(m);
  REQUIRE(reported.size() == 1);
  CHECK(reported[0].kind == "check");
  CHECK(reported[0].what == "failed");
}

TEST_CASE("an async collective's deadline runs from when the rank waits for it") {
  std::atomic<int> reported{0};
  FlightRecorder rec;
  rec.set_overdue_handler([&](const FlightEntry&) { ++reported; });
  rec.start_watchdog(10ms);
  const int64_t token = rec.begin(OpFamily::collective, "all-reduce (async)", "", 64, 0ms);
  std::this_thread::sleep_for(150ms);  // the rank's own backward: no deadline yet
  rec.arm(token, 1s);
  std::this_thread::sleep_for(100ms);
  CHECK(reported == 0);  // 250 ms after the launch, 100 ms into a 1 s wait
  REQUIRE(eventually([&] { return reported == 1; }));
  rec.end(token);
}

TEST_CASE("polling the store takes one entry, not the whole record") {
  FlightRecorder rec;
  rec.end(rec.begin(OpFamily::collective, "broadcast", "", 8, 0ms));
  for (int i = 0; i < 500; ++i) {  // a wait loop: check the keys, check for a failure
    rec.end(rec.begin(OpFamily::store, "check", "join/0 (+2 more)", 0, 1s));
    rec.end(rec.begin(OpFamily::store, "check", "failed", 0, 1s));
  }
  const auto ops = rec.entries();
  REQUIRE(ops.size() == 3);
  CHECK(ops[0].kind == "broadcast");
  CHECK(ops[1].repeats == 500);
  CHECK(ops[2].what == "failed");
  CHECK(ops[2].repeats == 500);
  CHECK(ops[2].end_s >= ops[1].start_s);
}

TEST_CASE("a limit beyond a year is no deadline") {
  std::atomic<int> reported{0};
  FlightRecorder rec;
  rec.set_overdue_handler([&](const FlightEntry&) { ++reported; });
  rec.start_watchdog(10ms);
  const int64_t token = rec.begin(OpFamily::store, "wait", "k", 0, std::chrono::hours(24 * 365 * 300));
  std::this_thread::sleep_for(50ms);  // an overflowed deadline would be in the past
  CHECK(reported == 0);
  CHECK(rec.entries().front().limit_s == 0);
  rec.end(token);
}

TEST_CASE("an overdue operation names the store host or the hung collective") {
  OverdueContext ctx;
  ctx.rank = 2;
  ctx.store_address = "10.0.0.1:29500";
  ctx.store_host = "rank 0";
  ctx.timeout_s = 20;
  FlightEntry store_op;
  store_op.family = OpFamily::store;
  store_op.kind = "check";
  store_op.what = "failed";
  store_op.limit_s = 20;
  auto [reason, code] = describe_overdue(store_op, ctx);
  CHECK(code == sana::kExitPeerFailed);
  CHECK_THAT(reason, Catch::Contains("rank 0 (the store host at 10.0.0.1:29500) has not answered a store check "
                                     "of 'failed' for 20 s: rank 0 is stopped, hung or cut off from rank 2"));

  FlightEntry coll;
  coll.family = OpFamily::collective;
  coll.kind = "all-reduce";
  coll.seq = 1234;
  coll.bytes = 4096;
  coll.limit_s = 25;
  std::tie(reason, code) = describe_overdue(coll, ctx);
  CHECK(code == sana::kExitPeerFailed);
  CHECK_THAT(reason, Catch::Contains("collective #1234 (all-reduce, 4096 bytes) has not finished after 25 s"));

  ctx.hosts_store = true;  // the host's own store stalling is this rank's failure
  std::tie(reason, code) = describe_overdue(store_op, ctx);
  CHECK(code == sana::kExitFailure);
  CHECK_THAT(reason, Catch::Contains("this rank's own store"));
}
