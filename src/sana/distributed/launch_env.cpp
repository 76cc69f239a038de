#include "sana/distributed/launch_env.h"

#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace sana::dist {

namespace {

struct Scheme {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;  // may be null: unknown
};

// Checked in order: torchrun sets RANK even inside an allocation that has Slurm variables.
constexpr Scheme kSchemes[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

int read_int(const EnvLookup& env, const char* name, const char* launcher, bool required,
             int fallback) {
  const char* text = env(name);
  if (text == nullptr || *text == '\0') {
    if (!required) return fallback;
    throw LaunchEnvError(fmt::format(
        "launched by {} but {} is not set; set it or launch with a complete environment",
        launcher, name));
  }
  int value = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || value < 0) {
    throw LaunchEnvError(fmt::format("{}='{}' is not a non-negative integer", name, text));
  }
  return value;
}

// Tasks of this Slurm step on this node. Slurm sets SLURM_NTASKS_PER_NODE only with
// --ntasks-per-node; SLURM_STEP_TASKS_PER_NODE ("4(x2),3") always. When the count for this
// node cannot be known, it is taken as below the world size, so no rank assumes that
// every process is on its host.
int slurm_tasks_on_this_node(const EnvLookup& env, int world_size) {
  const char* nodes = env("SLURM_STEP_NUM_NODES");
  if (nodes == nullptr) nodes = env("SLURM_NNODES");
  if (nodes != nullptr && std::atoi(nodes) == 1) return world_size;
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char* v = env(name);
    if (v == nullptr || *v == '\0') continue;
    const std::string text(v);
    const int first = std::atoi(v);
    // Homogeneous forms only: "4" or "4(x2)"; a list means per-node counts differ.
    if (text.find(',') == std::string::npos && first > 0) return std::min(first, world_size);
  }
  return std::max(1, world_size - 1);
}

}  // namespace

LaunchEnv detect_launch_env(const EnvLookup& lookup) {
  const EnvLookup env = lookup ? lookup : [](const char* n) { return std::getenv(n); };
  for (const Scheme& s : kSchemes) {
    const char* rank = env(s.rank);
    if (rank == nullptr || *rank == '\0') continue;
    // Slurm sets SLURM_PROCID for batch scripts too; only srun job steps have SLURM_STEP_ID.
    if (std::strcmp(s.launcher, "slurm") == 0 && env("SLURM_STEP_ID") == nullptr) continue;
    LaunchEnv e;
    e.launcher = s.launcher;
    const char* ours = env("SANA_LAUNCHER");
    if (e.launcher == "torchrun" && ours != nullptr && std::string(ours) == "1") {
      e.launcher = "sana-launch";  // our launcher speaks torchrun's environment
    }
    e.rank = read_int(env, s.rank, s.launcher, true, 0);
    e.world_size = read_int(env, s.world_size, s.launcher, true, 1);
    e.local_rank = read_int(env, s.local_rank, s.launcher, false, e.rank);
    e.local_world_size = s.local_world_size == nullptr
                             ? e.world_size
                             : read_int(env, s.local_world_size, s.launcher, false, e.world_size);
    if (e.launcher == "torchrun" || e.launcher == "sana-launch") {
      e.node_rank = read_int(env, "GROUP_RANK", s.launcher, false, -1);
    }
    if (e.world_size < 1 || e.rank >= e.world_size) {
      throw LaunchEnvError(fmt::format("{}={} is not below {}={}", s.rank, e.rank, s.world_size,
                                       e.world_size));
    }
    if (const char* addr = env("MASTER_ADDR")) e.master_addr = addr;
    e.master_port = read_int(env, "MASTER_PORT", s.launcher, false, 0);
    if (e.master_port > 65535) throw LaunchEnvError("MASTER_PORT must be at most 65535");
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = e.launcher == "torchrun" && agent != nullptr && std::string(agent) == "True";
    const char* launcher_store = env("SANA_LAUNCHER_STORE");
    e.launcher_store = e.launcher == "sana-launch" && launcher_store != nullptr && std::string(launcher_store) == "1";
    e.restart_count = read_int(env, "TORCHELASTIC_RESTART_COUNT", s.launcher, e.agent_store, 0);
    if (e.launcher == "slurm") {
      const char* nodes = env("SLURM_STEP_NODELIST");
      if (nodes == nullptr) nodes = env("SLURM_JOB_NODELIST");
      if (nodes != nullptr) e.first_host = first_slurm_host(nodes);
      if (const char* job = env("SLURM_JOB_ID")) e.job_id = job;
      e.local_world_size = slurm_tasks_on_this_node(env, e.world_size);
    }
    for (const char* name : {"SANA_RUN_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid"}) {
      const char* v = env(name);
      if (v != nullptr && *v != '\0' && e.run_id.empty()) e.run_id = v;
    }
    if (const char* token = env("SANA_RUN_TOKEN")) e.token = token;
    if (const char* join = env("SANA_JOIN")) e.join_id = std::atoi(join);
    if (e.run_id.empty() && !e.job_id.empty()) {
      const char* step = env("SLURM_STEP_ID");
      e.run_id = e.job_id + "." + (step ? step : "0");
    }
    return e;
  }
  return LaunchEnv{};
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets: "a[1-2,5],b" -> "a[1-2,5]".
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (open == std::string::npos) return first;
  // "node[01-03,07]" -> "node" + "01": the range's first number keeps its zero padding.
  const size_t stop = first.find_first_of(",-]", open + 1);
  return first.substr(0, open) + first.substr(open + 1, stop - open - 1);
}

RendezvousEndpoint resolve_endpoint(const LaunchEnv& env, const std::string& config_addr,
                                    int config_port) {
  RendezvousEndpoint ep;
  ep.run_id = env.run_id;
  const bool overridden = !config_addr.empty() || config_port > 0;
  if (env.agent_store && !overridden) {
    // torchrun's agent already listens on MASTER_ADDR:MASTER_PORT.
    ep.host = env.master_addr;
    ep.port = env.master_port;
    ep.server = false;
    ep.key_prefix = fmt::format("/worker/attempt_{}", env.restart_count);
    if (ep.host.empty() || ep.port == 0) {
      throw LaunchEnvError(
          "TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR or MASTER_PORT is not set");
    }
    return ep;
  }
  // Our launcher hosts it at MASTER_ADDR:MASTER_PORT unless the config points elsewhere
  // (then rank 0 hosts it there, as under any other launcher).
  const bool elsewhere = (!config_addr.empty() && config_addr != env.master_addr) ||
                         (config_port > 0 && config_port != env.master_port);
  ep.launcher_hosts = env.launcher_store && !elsewhere;
  ep.server = env.rank == 0 && !ep.launcher_hosts;
  ep.host = !config_addr.empty() ? config_addr : env.master_addr;
  if (ep.host.empty()) ep.host = env.first_host;
  if (ep.host.empty()) {
    if (env.local_world_size < env.world_size) {
      throw LaunchEnvError(fmt::format(
          "{} started {} processes on several hosts ({} on this one) but MASTER_ADDR is not set; "
          "set MASTER_ADDR to rank 0's host (mpirun: -x MASTER_ADDR=host -x MASTER_PORT=port) "
          "or the config key dist.master_addr",
          env.launcher, env.world_size, env.local_world_size));
    }
    ep.host = "127.0.0.1";  // every process is on this host
  }
  if (config_port > 0) {
    ep.port = config_port;
  } else if (env.master_port > 0) {
    ep.port = env.master_port;
  } else if (!env.job_id.empty()) {
    // Jobs sharing a node must not share a port: derive one from the Slurm job id.
    ep.port = 20000 + static_cast<int>(std::strtoul(env.job_id.c_str(), nullptr, 10) % 20000);
  } else {
    ep.port = kDefaultMasterPort;
  }
  ep.token = env.token;
  if (ep.token.empty()) {
    ep.token = derived_token(env.launcher, env.run_id, ep.host, ep.port);
    ep.token_derived = true;
  }
  return ep;
}

std::string derived_token(const std::string& launcher, const std::string& run_id, const std::string& host, int port) {
  return fmt::format("derived/{}/{}/{}:{}", launcher, run_id, host, port);
}

std::string random_token() {
  uint8_t raw[16] = {};
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof raw) {  // no entropy source: the time and pid, still unique per run
    const auto t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^ (uint64_t(getpid()) << 40);
    for (size_t i = 0; i < sizeof raw; ++i) raw[i] ^= static_cast<uint8_t>(t >> (8 * (i % 8)));
  }
  std::string hex;
  for (uint8_t b : raw) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace sana::dist
