// Which launcher started this process and where it sits in the job: torchrun, OpenMPI,
// MPICH/Intel MPI, Slurm srun, or none; and where the job meets (the rendezvous
// endpoint). Reads the environment only; never opens a socket and never includes torch.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "sana/util/error.h"

namespace sana::dist {

struct LaunchEnv {
  std::string launcher = "none";  // torchrun | sana-launch | openmpi | mpich | slurm | none
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = -1;  // torchrun and `sana-train launch`: GROUP_RANK, the node's place; -1: not given
  // Rendezvous hints from the environment (empty/0 when the launcher gives none).
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false;  // torchrun's agent hosts the TCPStore: every rank is a client
  // `sana-train launch` on node 0 hosts the run's store (SANA_LAUNCHER_STORE=1): every
  // rank is a client, and the store outlives any of them.
  bool launcher_store = false;
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT
  std::string first_host;    // Slurm: first host of the step's node list
  std::string job_id;        // Slurm: SLURM_JOB_ID, for a per-job default port
  // Names this run among others that might share a store endpoint: the launcher's run id
  // (SANA_RUN_ID, TORCHELASTIC_RUN_ID, Slurm job.step, OpenMPI job id), or "".
  std::string run_id;
  // The run's secret for the store (SANA_RUN_TOKEN; `sana-train launch` makes a random
  // one), or "" when the launcher gives none.
  std::string token;
  // dist.elastic continue: a replacement `sana-train launch` started for a lost rank
  // (SANA_JOIN=<id>, an original rank no process of the run has had); it joins the running
  // group at a step boundary. -1: an ordinary start.
  int join_id = -1;
};

// A launcher environment that is present but unusable (names the variable to fix).
class LaunchEnvError : public sana::UsageError {
 public:
  explicit LaunchEnvError(const std::string& what) : UsageError(what, "launch error") {}
};

using EnvLookup = std::function<const char*(const char*)>;

// Detects the launcher from `lookup` (getenv by default).
LaunchEnv detect_launch_env(const EnvLookup& lookup = nullptr);

// Where rank 0's store listens, and how this rank reaches it.
struct RendezvousEndpoint {
  std::string host;
  int port = 0;
  bool server = false;      // this process hosts the TCPStore
  bool launcher_hosts = false;  // `sana-train launch` on node 0 hosts it (LaunchEnv::launcher_store)
  std::string key_prefix;   // torchrun: "/worker/attempt_<n>"
  std::string run_id;       // from LaunchEnv::run_id
  // What every connection to the store must present: LaunchEnv::token, or where the
  // launcher gives none, one derived from the run id and the endpoint (the same on every
  // rank, but not secret: set SANA_RUN_TOKEN for that).
  std::string token;
  bool token_derived = false;

  // Who hosts the store, for messages: rank 0, our launcher, or torchrun's agent.
  std::string host_name() const {
    if (!key_prefix.empty()) return "torchrun's agent";
    return launcher_hosts ? "sana-train launch on node 0" : "rank 0";
  }
  // The store is not in any rank's process: it outlives the loss of rank 0.
  bool outlives_ranks() const { return launcher_hosts || !key_prefix.empty(); }
};

// Resolves the endpoint from the environment and config overrides (empty/0 = not set).
// Throws LaunchEnvError naming the variable or key to set when it cannot be known.
RendezvousEndpoint resolve_endpoint(const LaunchEnv& env, const std::string& config_addr,
                                    int config_port);

// The token of a run whose launcher gives none: the same on every rank (and on the launcher
// that hosts the store), but not secret.
std::string derived_token(const std::string& launcher, const std::string& run_id, const std::string& host, int port);

// "node[01-03],gpu7" -> "node01": the first host of a Slurm node list.
std::string first_slurm_host(const std::string& nodelist);

constexpr int kDefaultMasterPort = 29500;

// 32 hex digits from the kernel's random source: a run's store token (`sana-train launch`
// makes one per single-node run).
std::string random_token();

}  // namespace sana::dist
