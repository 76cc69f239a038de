#include "sana/distributed/launcher_worker.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string_view>

#include "sana/distributed/launcher_link.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

std::vector<std::string> worker_environment(const LaunchOptions& o, int local_rank, int port,
                                            int attempt, const std::string& run_id,
                                            int lifeline_fd, int message_fd, int join_id) {
  const int world = o.nnodes * o.nproc_per_node;
  std::vector<std::string> extra;
  if (join_id >= 0) extra.push_back(fmt::format("SANA_JOIN={}", join_id));  // a replacement for a lost rank
  std::vector<std::string> env{
      fmt::format("SANA_RUN_ID={}", run_id),
      fmt::format("{}={}", kLifelineVariable, lifeline_fd),
      fmt::format("{}={}", kMessagesVariable, message_fd),
      fmt::format("RANK={}", o.node_rank * o.nproc_per_node + local_rank),
      fmt::format("WORLD_SIZE={}", world),
      fmt::format("LOCAL_RANK={}", local_rank),
      fmt::format("LOCAL_WORLD_SIZE={}", o.nproc_per_node),
      fmt::format("GROUP_RANK={}", o.node_rank),
      fmt::format("MASTER_ADDR={}", o.master_addr),
      fmt::format("MASTER_PORT={}", port),
      fmt::format("TORCHELASTIC_RESTART_COUNT={}", attempt),
      fmt::format("TORCHELASTIC_MAX_RESTARTS={}", o.max_restarts),
      "TORCHELASTIC_USE_AGENT_STORE=False",  // not torchrun's agent store: ours, below
      "SANA_LAUNCHER=1",
      "SANA_LAUNCHER_STORE=1",  // node 0's launcher hosts the run's store (run_launcher)
  };
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// What a forked child needs to become the worker, all made before the fork (after it, the
// child only makes system calls).
struct ExecPlan {
  std::vector<char*> argv;  // argv[0]: the program
  std::vector<std::string> environment;  // the launcher's settings
  std::vector<char*> envp;  // the worker's whole environment: ours, then the rest of the launcher's
  int out_fd = -1, err_fd = -1;  // the pipes' write ends
  WorkerPipes pipes;
  pid_t parent = 0;
  int pause_ms = 0;  // tests only: a wait before exec, signals held
  sigset_t signals_before;
};

[[noreturn]] void become_worker(const ExecPlan& plan) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGPIPE}) signal(sig, SIG_DFL);
  if (plan.pause_ms > 0) usleep(static_cast<useconds_t>(plan.pause_ms) * 1000);  // a signal now waits
  pthread_sigmask(SIG_SETMASK, &plan.signals_before, nullptr);
  setpgid(0, 0);  // its own group: signals reach the worker and anything it starts
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher dies -> the worker dies
  if (getppid() != plan.parent) _exit(kExitFailure);
  dup2(plan.out_fd, STDOUT_FILENO);
  dup2(plan.err_fd, STDERR_FILENO);
  // A worker in a background group that read the terminal would stop for ever.
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  fcntl(plan.pipes.lifeline, F_SETFD, 0);  // inherited across exec
  fcntl(plan.pipes.messages, F_SETFD, 0);
  execve(plan.argv[0], plan.argv.data(), plan.envp.data());
  const char* why = std::strerror(errno);
  for (const char* part : {"cannot start ", static_cast<const char*>(plan.argv[0]), ": ", why, "\n"}) {
    (void)!write(STDERR_FILENO, part, std::strlen(part));
  }
  _exit(127);
}

}  // namespace

void Stream::emit(const std::string& prefix, const std::string& line) const {
  const std::string out = (log::is_log_line(line) ? std::string() : prefix) + line + "\n";
  (void)!write(out_fd, out.data(), out.size());
}

bool Stream::pump(const std::string& prefix) {
  char buf[65536];
  const ssize_t n = read(fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!pending.empty()) emit(prefix, pending);
    pending.clear();
    close(fd);
    fd = -1;
    return false;
  }
  pending.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', start)) {
    emit(prefix, pending.substr(start, nl - start));
    start = nl + 1;
  }
  pending.erase(0, start);
  return true;
}

std::string Worker::prefix() const { return fmt::format("[rank {}] ", rank); }

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitFailure;
}

Worker spawn(const LaunchOptions& o, int local_rank, int port, int attempt, const std::string& run_id,
             const WorkerPipes& pipes, int join_id) {
  Worker w;
  w.rank = join_id >= 0 ? join_id : o.node_rank * o.nproc_per_node + local_rank;
  w.local_rank = local_rank;
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    for (int fd : {out_pipe[0], out_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    throw std::runtime_error(fmt::format("pipe: {}", why));
  }
  ExecPlan plan;
  plan.argv.push_back(const_cast<char*>(o.program.c_str()));
  for (const auto& a : o.worker_args) plan.argv.push_back(const_cast<char*>(a.c_str()));
  plan.argv.push_back(nullptr);
  plan.environment = worker_environment(o, local_rank, port, attempt, run_id, pipes.lifeline, pipes.messages, join_id);
  // The whole environment before the fork: putenv in the child could take a lock another
  // thread of the launcher (the store's) held at the fork.
  std::set<std::string, std::less<>> ours;
  for (const auto& kv : plan.environment) {
    ours.insert(kv.substr(0, kv.find('=')));
    plan.envp.push_back(const_cast<char*>(kv.c_str()));
  }
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (ours.count(kv.substr(0, kv.find('='))) == 0) plan.envp.push_back(*e);
  }
  plan.envp.push_back(nullptr);
  plan.out_fd = out_pipe[1];
  plan.err_fd = err_pipe[1];
  plan.pipes = pipes;
  plan.parent = getpid();
  plan.pause_ms = local_rank == o.pause_local_rank ? o.pause_before_exec_ms : 0;
  // Until exec a child has the launcher's signal handlers, which write into the launcher's
  // signal pipe: a SIGTERM for a worker just forked (the launcher stopping everyone) read
  // as the launcher's own stop, which ends the run and its restarts. Signals stay blocked
  // across the fork; the child puts the handlers back to the default before letting them in.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &plan.signals_before);
  const pid_t pid = fork();
  if (pid == 0) become_worker(plan);
  const int fork_errno = errno;
  if (pid > 0) setpgid(pid, pid);  // also from this side, so a signal right away finds the group
  pthread_sigmask(SIG_SETMASK, &plan.signals_before, nullptr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    for (int fd : {out_pipe[0], err_pipe[0]}) close(fd);
    throw std::runtime_error(fmt::format("fork: {}", std::strerror(fork_errno)));
  }
  w.pid = pid;
  w.out.fd = out_pipe[0];
  w.err.fd = err_pipe[0];
  w.err.out_fd = STDERR_FILENO;
  return w;
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (auto& w : workers) {
    if (!w.exit_code) kill(-w.pid, sig);
  }
}

bool is_stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  const char state = line[close_paren + 2];
  return state == 'T' || state == 't';
}

bool all_exited(const std::vector<Worker>& workers) {
  for (const auto& w : workers) {
    if (!w.exit_code || w.out.fd >= 0 || w.err.fd >= 0) return false;
  }
  return true;
}

}  // namespace sana::dist
