// Which launcher started us, read from the environment alone.
#include "catch.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sana/distributed/launch_env.h"
#include "sana/distributed/nccl_env.h"

using sana::dist::detect_launch_env;
using sana::dist::LaunchEnvError;

namespace {
sana::dist::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("no launcher means one process", "[dist]") {
  const auto e = detect_launch_env(env_of({}));
  CHECK(e.launcher == "none");
  CHECK(e.world_size == 1);
  CHECK(e.rank == 0);
}

TEST_CASE("torchrun, OpenMPI, MPICH and srun environments are recognised", "[dist]") {
  auto e = detect_launch_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                     {"LOCAL_WORLD_SIZE", "2"}}));
  CHECK((e.launcher == "torchrun" && e.rank == 3 && e.world_size == 4 && e.local_rank == 1 &&
         e.local_world_size == 2));
  e = detect_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  CHECK((e.launcher == "openmpi" && e.rank == 1 && e.world_size == 2));
  e = detect_launch_env(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}}));
  CHECK((e.launcher == "mpich" && e.world_size == 3 && e.local_rank == 0));
  e = detect_launch_env(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"SLURM_STEP_ID", "0"}}));
  CHECK((e.launcher == "slurm" && e.rank == 5 && e.local_world_size == 4));
}

TEST_CASE("a Slurm batch script without srun is one process", "[dist]") {
  const auto e = detect_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}));
  CHECK(e.launcher == "none");
}

TEST_CASE("an incomplete or inconsistent environment names the variable", "[dist]") {
  CHECK_THROWS_WITH(detect_launch_env(env_of({{"RANK", "0"}})), Catch::Contains("WORLD_SIZE"));
  CHECK_THROWS_WITH(detect_launch_env(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})),
                    Catch::Contains("RANK='x'"));
  CHECK_THROWS_WITH(detect_launch_env(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
                    Catch::Contains("RANK=2 is not below WORLD_SIZE=2"));
}

TEST_CASE("the rendezvous endpoint comes from the launcher, the config or the job", "[dist]") {
  using sana::dist::resolve_endpoint;
  SECTION("torchrun's agent hosts the store: every rank is a client under the attempt prefix") {
    const auto e = detect_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_RESTART_COUNT", "2"}}));
    const auto ep = resolve_endpoint(e, "", 0);
    CHECK_FALSE(ep.server);
    CHECK(ep.host == "10.0.0.1");
    CHECK(ep.port == 1234);
    CHECK(ep.key_prefix == "/worker/attempt_2");
  }
  SECTION("otherwise rank 0 hosts it, and config overrides win") {
    const auto e = detect_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}}));
    auto ep = resolve_endpoint(e, "", 0);
    CHECK(ep.server);
    CHECK(ep.key_prefix.empty());
    ep = resolve_endpoint(e, "10.9.9.9", 4321);
    CHECK((ep.host == "10.9.9.9" && ep.port == 4321));
  }
  SECTION("our launcher hosts it: rank 0 is a client too, unless the config names another endpoint") {
    const auto e = detect_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SANA_LAUNCHER", "1"},
                                             {"SANA_LAUNCHER_STORE", "1"}, {"SANA_RUN_ID", "launch-1"},
                                             {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}}));
    auto ep = resolve_endpoint(e, "", 0);
    CHECK_FALSE(ep.server);
    CHECK(ep.launcher_hosts);
    CHECK(ep.outlives_ranks());
    CHECK(ep.host_name() == "sana-train launch on node 0");
    // The launcher derives the same token from the same facts (no SANA_RUN_TOKEN given).
    CHECK(ep.token == sana::dist::derived_token("sana-launch", "launch-1", "10.0.0.1", 1234));
    ep = resolve_endpoint(e, "10.0.0.1", 1234);  // the launcher's own endpoint, repeated: still its store
    CHECK((ep.launcher_hosts && !ep.server));
    ep = resolve_endpoint(e, "", 4321);
    CHECK((ep.server && !ep.launcher_hosts && !ep.outlives_ranks() && ep.host_name() == "rank 0"));
  }
  SECTION("mpirun on one host needs no MASTER_ADDR") {
    const auto e = detect_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
    const auto ep = resolve_endpoint(e, "", 0);
    CHECK(ep.host == "127.0.0.1");
    CHECK(ep.port == sana::dist::kDefaultMasterPort);
    CHECK_FALSE(ep.server);
  }
  SECTION("mpirun across hosts without MASTER_ADDR says which variable to set") {
    const auto e = detect_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
    CHECK_THROWS_WITH(resolve_endpoint(e, "", 0),
                      Catch::Contains("MASTER_ADDR is not set") && Catch::Contains("-x MASTER_ADDR"));
    CHECK(resolve_endpoint(e, "node0", 0).host == "node0");
  }
  SECTION("srun: the first host of the step and a port from the job id") {
    const auto e = detect_launch_env(env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"},
                                             {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_ID", "123456"},
                                             {"SLURM_STEP_NODELIST", "gpu[007-008,010],cpu1"},
                                             {"SLURM_NTASKS_PER_NODE", "4(x2)"}}));
    const auto ep = resolve_endpoint(e, "", 0);
    CHECK(ep.host == "gpu007");
    CHECK(ep.port == 20000 + 123456 % 20000);
  }
}

TEST_CASE("Slurm node lists give their first host", "[dist]") {
  using sana::dist::first_slurm_host;
  CHECK(first_slurm_host("node1") == "node1");
  CHECK(first_slurm_host("node1,node2") == "node1");
  CHECK(first_slurm_host("node[01-04]") == "node01");
  CHECK(first_slurm_host("rack2-n[7,9-11],other") == "rack2-n7");
}

TEST_CASE("our launcher is recognised by name", "[dist]") {
  const auto e = detect_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SANA_LAUNCHER", "1"}}));
  CHECK(e.launcher == "sana-launch");
}

namespace {
// Sets (or with nullptr unsets) NCCL variables for one test and restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, const char*> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      if (value) {
        setenv(name.c_str(), value, 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};
const std::map<std::string, const char*> kNoNcclSettings = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", nullptr},
                                                           {"NCCL_ASYNC_ERROR_HANDLING", nullptr},
                                                           {"TORCH_NCCL_BLOCKING_WAIT", nullptr},
                                                           {"NCCL_BLOCKING_WAIT", nullptr},
                                                           {"NCCL_DEBUG", nullptr}};
}  // namespace

TEST_CASE("a stuck NCCL collective aborts the job: error handling is on unless the user said 0", "[dist]") {
  using sana::dist::apply_nccl_defaults;
  SECTION("LibTorch 1.13 (no abort by default): switched on when unset") {
    ScopedEnv env(kNoNcclSettings);
    const auto e = apply_nccl_defaults(false);
    CHECK(std::string(std::getenv("NCCL_ASYNC_ERROR_HANDLING")) == "1");
    CHECK(e.set_by_us == std::vector<std::string>{"NCCL_ASYNC_ERROR_HANDLING=1"});
    CHECK(std::find(e.variables.begin(), e.variables.end(), "NCCL_ASYNC_ERROR_HANDLING=1") != e.variables.end());
    CHECK(e.warning.empty());
  }
  SECTION("LibTorch 2.2+ aborts by default: nothing is set") {
    ScopedEnv env(kNoNcclSettings);
    const auto e = apply_nccl_defaults(true);
    CHECK(std::getenv("NCCL_ASYNC_ERROR_HANDLING") == nullptr);
    CHECK(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") == nullptr);
    CHECK(e.set_by_us.empty());
  }
  SECTION("the user's choice is kept and reported, sorted with the other NCCL variables") {
    auto vars = kNoNcclSettings;
    vars["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3";
    vars["NCCL_DEBUG"] = "INFO";
    ScopedEnv env(vars);
    const auto e = apply_nccl_defaults(false);
    CHECK(e.set_by_us.empty());
    CHECK(std::getenv("NCCL_ASYNC_ERROR_HANDLING") == nullptr);
    const auto debug = std::find(e.variables.begin(), e.variables.end(), "NCCL_DEBUG=INFO");
    const auto handling = std::find(e.variables.begin(), e.variables.end(), "TORCH_NCCL_ASYNC_ERROR_HANDLING=3");
    REQUIRE(debug != e.variables.end());
    REQUIRE(handling != e.variables.end());
    CHECK(debug < handling);
  }
  SECTION("an explicit 0 without blocking wait is kept, with a warning that names the variable") {
    auto vars = kNoNcclSettings;
    vars["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0";
    ScopedEnv env(vars);
    const auto e = apply_nccl_defaults(false);
    CHECK(std::string(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) == "0");
    CHECK(e.set_by_us.empty());
    CHECK(e.warning.find("TORCH_NCCL_ASYNC_ERROR_HANDLING") != std::string::npos);
    CHECK(e.warning.find("hang") != std::string::npos);
  }
  SECTION("0 with blocking wait on is a working choice: no warning") {
    auto vars = kNoNcclSettings;
    vars["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0";
    vars["TORCH_NCCL_BLOCKING_WAIT"] = "1";
    ScopedEnv env(vars);
    CHECK(apply_nccl_defaults(true).warning.empty());
  }
}
