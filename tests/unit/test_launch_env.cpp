// Which launcher started us, read from the environment alone.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "sana/dist/launch_env.h"

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
