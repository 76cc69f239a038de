// Which launcher started this process and where it sits in the job: torchrun, OpenMPI,
// MPICH/Intel MPI, Slurm, or none. Reads the environment only; never opens a socket and
// never includes torch.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace sana::dist {

struct LaunchEnv {
  std::string launcher = "none";  // torchrun | openmpi | mpich | slurm | none
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};

// A launcher environment that is present but unusable (names the variable to fix).
class LaunchEnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using EnvLookup = std::function<const char*(const char*)>;

// Detects the launcher from `lookup` (getenv by default).
LaunchEnv detect_launch_env(const EnvLookup& lookup = nullptr);

}  // namespace sana::dist
