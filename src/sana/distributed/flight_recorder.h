// The flight record of one process: its last collectives and store operations (kind,
// key, bytes, start and end), and a deadline on each one still in flight. A watchdog
// thread, which touches neither the store nor the backend, calls the overdue handler when
// an operation passes its deadline (a stopped store host or a hung peer), and writes the
// record as JSON on SIGUSR1. Plain C++: never includes torch. docs/distributed.md says who
// records what and which deadline each operation gets.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace sana::dist {

enum class OpFamily { store, collective };

// Where a run's flight records go: work_dir/flight/rank<N>.json.
inline std::string flight_record_dir(const std::string& work_dir) { return work_dir + "/flight"; }

struct FlightEntry {
  int64_t seq = 0;  // numbered per family: collective #seq, store operation #seq
  OpFamily family = OpFamily::store;
  std::string kind;  // "all-reduce", "check", "get", ...
  std::string what;  // a store key, or what the collective carries
  int64_t bytes = 0;
  double start_s = 0;             // seconds since the recorder was made
  double end_s = -1;              // < 0: still in flight
  double limit_s = 0;             // 0: no deadline
  std::string error;              // what it failed with, if it did
  int64_t repeats = 1;            // a polled store operation: how many times in a row
};

class FlightRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  // Called on the watchdog thread with the overdue operation; it normally ends the process.
  using OverdueHandler = std::function<void(const FlightEntry&)>;

  static constexpr size_t kKept = 64;  // finished operations kept for the record
  // Limits beyond this are no limit (and cannot overflow the clock).
  static constexpr std::chrono::hours kLongest{24 * 365};

  FlightRecorder();
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The process's recorder (never destroyed: threads may record until the very end).
  static FlightRecorder& process();

  // Where dump() writes (DIR/rank<N>.json) and who this process is.
  void set_identity(int rank, int world_size, const std::string& dir);

  // Records the start of an operation and returns its token. `limit` zero: no deadline.
  // `keep` false: forgotten when it ends well (the failure watch's beats would flood the
  // record); kept when it fails.
  // A store operation that repeats one of the last few (a polling loop) is counted in that
  // entry's `repeats` instead of taking a place of its own.
  int64_t begin(OpFamily family, std::string kind, std::string what, int64_t bytes,
                std::chrono::milliseconds limit, bool keep = true);
  // Gives a started operation its deadline from now: an async collective is not late
  // while its own rank is still computing, only once the rank waits for it.
  void arm(int64_t token, std::chrono::milliseconds limit);
  void end(int64_t token, const std::string& error = "");

  int64_t collectives_started() const { return collectives_.load(); }

  // Kept and in-flight operations, oldest first.
  std::vector<FlightEntry> entries() const;
  std::string to_json(const std::string& reason) const;
  // Writes the record to DIR/rank<N>.json; returns the path, or "" when there is no DIR or
  // the write failed. Never throws.
  std::string dump(const std::string& reason) noexcept;

  // Starts the watchdog (once); it checks deadlines and the SIGUSR1 flag every `period`.
  void start_watchdog(std::chrono::milliseconds period = std::chrono::milliseconds(100));
  // What the watchdog does with an overdue operation (empty: only marks it reported).
  void set_overdue_handler(OverdueHandler handler);
  // SIGUSR1 makes the process's recorder write its record and go on, and starts its
  // watchdog (which does the writing). Every command calls it first.
  static void install_sigusr1();

 private:
  struct Open {
    FlightEntry entry;
    Clock::time_point deadline;
    bool has_deadline = false;
    bool keep = true;
  };
  void watch();
  double seconds_since_start(Clock::time_point t) const;
  // Folds a finished polled store operation into a recent equal one; false if none.
  bool merge_repeat(const FlightEntry& e);

  const Clock::time_point started_;
  const std::chrono::system_clock::time_point started_wall_;
  mutable std::mutex mutex_;
  std::mutex dump_mutex_;  // one writer of the file at a time
  std::map<int64_t, Open> open_;
  std::deque<FlightEntry> kept_;
  int64_t next_token_ = 1;
  int64_t store_seq_ = 0;
  std::atomic<int64_t> collectives_{0};
  int rank_ = -1;
  int world_size_ = 0;
  std::string dir_;

  OverdueHandler handler_;
  std::chrono::milliseconds period_{100};
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread watchdog_;
};

// What an overdue operation means, for the message a rank stops with.
struct OverdueContext {
  int rank = 0;
  std::string store_address;  // host:port
  std::string store_host;     // who hosts the store: "rank 0", "torchrun's agent"
  bool hosts_store = false;   // this process is the store host
  double timeout_s = 0;       // dist.timeout_s
};
// The message (naming the unresponsive store host, or the hung collective) and the exit
// code: 3 when another process is to blame, 1 when this rank's own store stalls.
std::pair<std::string, int> describe_overdue(const FlightEntry& overdue, const OverdueContext& ctx);

// Records one operation on the process's recorder for the scope's lifetime.
class FlightOp {
 public:
  FlightOp(OpFamily family, std::string kind, std::string what, int64_t bytes,
           std::chrono::milliseconds limit, bool keep = true)
      : token_(FlightRecorder::process().begin(family, std::move(kind), std::move(what), bytes,
                                               limit, keep)) {}
  ~FlightOp() { FlightRecorder::process().end(token_, error_); }
  FlightOp(const FlightOp&) = delete;
  FlightOp& operator=(const FlightOp&) = delete;
  void failed(const std::string& error) { error_ = error; }

 private:
  int64_t token_;
  std::string error_;
};

}  // namespace sana::dist
