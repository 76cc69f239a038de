#include "sana/distributed/launcher.h"
#include "sana/distributed/launch_env.h"
#include "sana/distributed/launcher_link.h"
#include "sana/distributed/launcher_worker.h"
#include "sana/distributed/launcher_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <algorithm>
#include <optional>
#include <thread>

#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const unsigned char s = static_cast<unsigned char>(sig);
  const int saved = errno;
  (void)!write(g_signal_pipe[1], &s, 1);
  errno = saved;
}

void say(const std::string& line) {
  const std::string out = "[launcher] " + line + "\n";
  (void)!write(STDERR_FILENO, out.data(), out.size());
}

// The read end of this pipe is inherited by every worker (and what it starts); the
// launcher alone holds the write end, so its death, even by SIGKILL, is EOF for them.
int g_lifeline[2] = {-1, -1};
// Workers tell the launcher things by writing lines here (tell_launcher): "elastic MS" (the
// run goes on without a lost rank: dist.elastic continue, with dist.heartbeat_timeout_s in
// milliseconds), "store host N" (rank N hosts the run's store: the config named another
// address or port than this launcher's), "lost N" (rank N left the group).
int g_messages[2] = {-1, -1};

// One attempt's workers and what the launcher knows of them: who has exited, the first
// failure, and the deadlines for killing stragglers and for draining their output.
class Attempt {
 public:
  Attempt(const LaunchOptions& o, int& user_signal) : o_(o), user_signal_(user_signal) {}

  void start_workers(int port, int attempt, const std::string& run_id) {
    port_ = port;
    attempt_ = attempt;
    run_id_ = run_id;
    try {
      for (int i = 0; i < o_.nproc_per_node; ++i) {
        workers_.push_back(spawn(o_, i, port, attempt, run_id, {g_lifeline[0], g_messages[1]}));
      }
    } catch (const std::exception& e) {
      say(fmt::format("cannot start the workers: {}", e.what()));
      first_failure_ = kExitFailure;
      stop_all(SIGKILL);
    }
  }
  bool done() const { return all_exited(workers_); }
  // Under dist.elastic continue, the heartbeat timeout the workers gave; else 0.
  int64_t elastic_heartbeat_ms() const { return elastic_ ? heartbeat_ms_ : 0; }
  // The attempt's code: its first failure; under dist.elastic continue a node whose every
  // worker was lost fails with the first loss's code.
  int first_failure() const {
    if (first_failure_ != 0 || lost_code_ == 0) return first_failure_;
    const bool any_ok = std::any_of(workers_.begin(), workers_.end(),
                                    [](const Worker& w) { return w.exit_code && *w.exit_code == 0; });
    return any_ok ? 0 : lost_code_;
  }

  // Waits up to 100 ms for a signal or output, then handles what arrived.
  void serve_events() {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}, {g_messages[0], POLLIN, 0}};
    struct Watched {
      Stream* stream;
      const Worker* owner;
    };
    std::vector<Watched> streams;
    for (auto& w : workers_) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back({s, &w});
        }
      }
    }
    poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) take_signal();
    if (fds[1].revents & POLLIN) take_messages();
    for (size_t i = 0; i < streams.size(); ++i) {
      if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) {
        streams[i].stream->pump(streams[i].owner->prefix());
      }
    }
  }

  void reap_exited() {
    for (auto& w : workers_) {
      if (w.exit_code) continue;
      int status = 0;
      if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.exit_code = exit_code_of(status);
      kill(-w.pid, SIGKILL);  // anything the worker left behind in its group
      note_exit(w.rank, *w.exit_code);
    }
  }

  void kill_after_grace() {
    if (stop_pending_ && Clock::now() > stop_at_) {
      stop_pending_ = false;
      if (!stopping_) stop_all(SIGTERM);
    }
    if (kill_pending_ && Clock::now() > kill_at_) {
      say("workers still running after the grace period; killing them");
      signal_all(workers_, SIGKILL);
      kill_pending_ = false;
    }
  }

  // Every worker is reaped: a descendant that left its group may still hold a pipe.
  void close_pipes_after_drain() {
    const bool reaped = std::all_of(workers_.begin(), workers_.end(),
                                    [](const Worker& w) { return w.exit_code.has_value(); });
    if (reaped && !draining_) {
      draining_ = true;
      drain_until_ = Clock::now() + std::chrono::seconds(2);
    }
    if (draining_ && Clock::now() > drain_until_) {
      for (auto& w : workers_) {
        for (Stream* st : {&w.out, &w.err}) {
          if (st->fd >= 0) {
            close(st->fd);
            st->fd = -1;
          }
        }
      }
    }
  }

  // dist.elastic continue: a worker stopped (SIGSTOP, a debugger) for longer than the
  // heartbeat timeout + 5 s has been left out by the run. Its peers tell this launcher so
  // ("lost N"), but on a node where no peer is left, or when the stopped one is a rank 0
  // hosting the store (whose peers then stop), nobody can: the launcher would wait for it
  // for ever.
  void kill_long_stopped() {
    if (!elastic_ || heartbeat_ms_ <= 0 || stopping_ || Clock::now() < next_stop_check_) return;
    next_stop_check_ = Clock::now() + std::chrono::seconds(1);
    const auto limit = std::chrono::milliseconds(heartbeat_ms_) + std::chrono::seconds(5);
    for (auto& w : workers_) {
      if (w.exit_code || w.left_out) continue;
      if (!is_stopped(w.pid)) {
        w.stopped_since.reset();
        continue;
      }
      if (!w.stopped_since) w.stopped_since = Clock::now();
      if (Clock::now() - *w.stopped_since < limit) continue;
      w.left_out = true;
      say(fmt::format("rank {} has been stopped for over {:.0f} s, past dist.heartbeat_timeout_s: the run has left "
                      "it out; killing it",
                      w.rank, std::chrono::duration<double>(limit).count()));
      kill(-w.pid, SIGKILL);
    }
  }

  // dist.elastic continue: a replacement for each lost worker, while --max-restarts
  // allows; it joins the running group at a step boundary (SANA_JOIN, a new id).
  void start_replacements() {
    const auto lost = std::move(to_replace_);
    to_replace_.clear();
    for (int rank : lost) replace(rank);
  }

 private:
  void stop_all(int sig) {
    stopping_ = true;
    signal_all(workers_, sig);
    // A stopped worker would sit out the whole grace period and then be killed anyway.
    for (auto& w : workers_) {
      if (w.exit_code || sig == SIGKILL || !is_stopped(w.pid)) continue;
      say(fmt::format("rank {} is stopped (SIGSTOP or a debugger) and cannot act on the signal; killing it",
                      w.rank));
      kill(-w.pid, SIGKILL);
    }
    kill_pending_ = true;
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(o_.grace_s));
  }

  void take_signal() {
    unsigned char sig = 0;
    if (read(g_signal_pipe[0], &sig, 1) != 1) return;
    if (sig == SIGUSR1) {  // not a stop: every worker writes its flight record and goes on
      say("got SIGUSR1; passing it to every worker (each writes work_dir/flight/rank<N>.json)");
      signal_all(workers_, SIGUSR1);
      return;
    }
    if (user_signal_ == 0) {
      user_signal_ = sig;
      say(fmt::format("got signal {}; stopping all workers", static_cast<int>(sig)));
      stop_all(sig);
    }
  }

  // Lines from the workers (tell_launcher), each written whole.
  void take_messages() {
    char buf[4096];
    const ssize_t n = read(g_messages[0], buf, sizeof buf);
    if (n <= 0) return;
    messages_.append(buf, static_cast<size_t>(n));
    for (auto nl = messages_.find('\n'); nl != std::string::npos; nl = messages_.find('\n')) {
      const std::string line = messages_.substr(0, nl);
      messages_.erase(0, nl + 1);
      if (line.rfind("elastic", 0) == 0) {
        elastic_ = true;
        if (line.size() > 8) heartbeat_ms_ = std::max<int64_t>(heartbeat_ms_, std::atoll(line.c_str() + 8));
      } else if (line.rfind("store host ", 0) == 0) {
        store_rank_ = std::atoi(line.c_str() + 11);
      } else if (line.rfind("lost ", 0) == 0) {
        const int lost = std::atoi(line.c_str() + 5);
        for (auto& w : workers_) {
          if (w.rank != lost || w.exit_code || w.left_out) continue;
          w.left_out = true;
          say(fmt::format("rank {} was left out of the run (lost); killing it", lost));
          kill(-w.pid, SIGKILL);
        }
      }
    }
  }

  void note_exit(int rank, int code) {
    if (code == 0 || user_signal_ != 0) return;
    // dist.elastic continue: the others go on without a lost rank, rank 0 too while this
    // launcher hosts the store; a rank that hosts it ("store host N") takes it along, so its
    // failure stops everyone as before.
    if (elastic_ && rank != store_rank_ && !stopping_) {
      if (lost_code_ == 0) lost_code_ = code;
      say(fmt::format("rank {} exited with code {}; the others go on without it (dist.elastic: continue)", rank,
                      code));
      to_replace_.push_back(rank);  // started once the reaping loop is over
      return;
    }
    // A worker that stopped because another failed (code 3), or that we stopped, is
    // not the cause: the cause's code wins even when it arrives a moment later.
    const bool consequence = code == kExitPeerFailed ||
                             (stopping_ && (code == 128 + SIGTERM || code == 128 + SIGKILL));
    if (first_failure_ == 0 || (first_failure_ == kExitPeerFailed && !consequence)) {
      first_failure_ = code;
      say(fmt::format("rank {} exited with code {}{}", rank, code,
                      stopping_ || consequence ? "" : "; stopping the other workers"));
    }
    if (stopping_) return;
    // A rank that stopped because another failed knows the cause is ending too: that
    // rank gets a moment to exit with its own code before SIGTERM would replace it.
    if (!consequence || first_failure_ != kExitPeerFailed) {
      stop_all(SIGTERM);
    } else if (!stop_pending_) {
      stop_pending_ = true;
      stop_at_ = Clock::now() + std::chrono::seconds(2);
    }
  }

  void replace(int rank) {
    if (replacements_ >= o_.max_restarts || stopping_) return;
    // A worker that succeeded means the run has ended: nothing to join.
    if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.exit_code == 0; })) return;
    const auto lost = std::find_if(workers_.begin(), workers_.end(), [&](const Worker& w) { return w.rank == rank; });
    if (lost == workers_.end()) return;
    const int local_rank = lost->local_rank;
    const int id = o_.nnodes * o_.nproc_per_node + replacements_++;
    try {
      workers_.push_back(spawn(o_, local_rank, port_, attempt_, run_id_, {g_lifeline[0], g_messages[1]}, id));
      say(fmt::format("replacement {} of {} for rank {}: joins the run as id {} at a step boundary", replacements_,
                      o_.max_restarts, rank, id));
    } catch (const std::exception& e) {
      say(fmt::format("cannot start a replacement for rank {}: {}", rank, e.what()));
    }
  }

  const LaunchOptions& o_;
  int& user_signal_;
  int port_ = 0, attempt_ = 0;
  std::string run_id_;
  int replacements_ = 0;
  std::vector<int> to_replace_;
  std::vector<Worker> workers_;
  int first_failure_ = 0;
  bool elastic_ = false;  // a worker said "elastic"
  int64_t heartbeat_ms_ = 0;  // the heartbeat timeout it gave
  int store_rank_ = -1;       // the rank that said it hosts the store (-1: this launcher or none)
  Clock::time_point next_stop_check_{};
  int lost_code_ = 0;     // the first code of a worker the others went on without
  std::string messages_;
  bool stopping_ = false;
  bool stop_pending_ = false;  // SIGTERM at stop_at_ (after a consequence's exit)
  Clock::time_point stop_at_{};
  bool kill_pending_ = false;  // SIGKILL at kill_at_ unless all have exited
  Clock::time_point kill_at_{};
  bool draining_ = false;  // all reaped: output gets until drain_until_
  Clock::time_point drain_until_{};
};

// One attempt: all workers from start to end. Returns the attempt's first failure code
// (0 when all succeeded); sets `user_signal` when the launcher was told to stop, and
// `heartbeat_ms` to the workers' heartbeat timeout under dist.elastic continue (else 0).
int run_attempt(const LaunchOptions& o, int port, int attempt, const std::string& run_id,
                int& user_signal, int64_t& heartbeat_ms) {
  Attempt a(o, user_signal);
  a.start_workers(port, attempt, run_id);
  while (!a.done()) {
    a.serve_events();
    a.reap_exited();
    a.start_replacements();
    a.kill_long_stopped();
    a.kill_after_grace();
    a.close_pipes_after_drain();
  }
  heartbeat_ms = a.elastic_heartbeat_ms();
  return a.first_failure();
}

}  // namespace

std::string check_launch_options(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) return "--nproc-per-node must be at least 1";
  if (o.nnodes < 1) return "--nnodes must be at least 1";
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    return fmt::format("--node-rank must be in [0, {})", o.nnodes);
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    return "--master-port is required with --nnodes > 1 (every node must use the same one)";
  }
  if (o.nnodes > 1 && (o.master_addr == "127.0.0.1" || o.master_addr == "localhost")) {
    return "--master-addr must be node 0's address with --nnodes > 1";
  }
  if (o.master_port < 0 || o.master_port > 65535) return "--master-port must be in [0, 65535]";
  if (o.max_restarts < 0) return "--max-restarts must be at least 0";
  if (o.max_restarts > 0 && o.nnodes > 1) {
    return "--max-restarts needs --nnodes 1: the launchers of several nodes do not restart in "
           "step with each other";
  }
  if (o.program.empty()) {
    return "nothing to run: give the worker's arguments after --, e.g. "
           "sana-train launch --nproc-per-node 2 -- check-dist";
  }
  return "";
}

int run_launcher(const LaunchOptions& o) {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return kExitFailure;
  if (pipe2(g_lifeline, O_CLOEXEC) != 0) return kExitFailure;
  if (pipe2(g_messages, O_CLOEXEC) != 0) return kExitFailure;
  fcntl(g_messages[0], F_SETFL, O_NONBLOCK);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // The run's token, which every connection to its store must present: random for a
  // single-node run; nodes must share one, so several nodes use SANA_RUN_TOKEN when set
  // and otherwise one derived from the endpoint (resolve_endpoint).
  if (o.nnodes == 1 && std::getenv("SANA_RUN_TOKEN") == nullptr) {
    setenv("SANA_RUN_TOKEN", random_token().c_str(), 1);
  }
  int user_signal = 0;
  int code = 0;
  // Every node's launcher derives the same run id from the endpoint; one node adds a
  // random part so two runs on a host never share store keys.
  const std::string base_id =
      o.nnodes > 1 ? fmt::format("launch-{}-{}", o.master_addr, o.master_port)
                   : fmt::format("launch-{}-{}", getpid(), Clock::now().time_since_epoch().count());
  for (int attempt = 0; attempt <= o.max_restarts; ++attempt) {
    const std::string run_id = fmt::format("{}-{}", base_id, attempt);
    std::unique_ptr<StoreServer> store;  // node 0's, for this attempt's workers
    int port = o.master_port;
    if (o.node_rank == 0) {
      try {
        store = host_store(o, run_id, say);
      } catch (const std::exception& e) {
        say(e.what());
        return kExitFailure;
      }
      port = store->port();
    }
    if (attempt > 0) say(fmt::format("restart {} of {}", attempt, o.max_restarts));
    int64_t heartbeat_ms = 0;
    code = run_attempt(o, port, attempt, run_id, user_signal, heartbeat_ms);
    if (store && o.nnodes > 1) {
      // Going on without node 0's workers (elastic): as long as a live worker is heard
      // from; else only while the others finish or read the failure.
      const auto quiet = std::chrono::milliseconds(std::max<int64_t>(heartbeat_ms, 2000));
      const int sig = serve_other_nodes(*store, quiet, g_signal_pipe[0], say);
      if (user_signal == 0) user_signal = sig;
    }
    if (code == 0 || user_signal != 0) break;
  }
  if (user_signal != 0) return 128 + user_signal;
  return code;
}

}  // namespace sana::dist
