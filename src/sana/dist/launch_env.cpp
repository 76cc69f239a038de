#include "sana/dist/launch_env.h"

#include <fmt/format.h>

#include <charconv>
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
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
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
  // Slurm writes per-node counts like "2(x3)": the leading number is the one we need.
  const bool slurm_count = std::strncmp(name, "SLURM_NTASKS_PER_NODE", 21) == 0;
  if (ec != std::errc() || (ptr != end && !(slurm_count && *ptr == '(')) || value < 0) {
    throw LaunchEnvError(fmt::format("{}='{}' is not a non-negative integer", name, text));
  }
  return value;
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
    e.rank = read_int(env, s.rank, s.launcher, true, 0);
    e.world_size = read_int(env, s.world_size, s.launcher, true, 1);
    e.local_rank = read_int(env, s.local_rank, s.launcher, false, e.rank);
    e.local_world_size = read_int(env, s.local_world_size, s.launcher, false, e.world_size);
    if (e.world_size < 1 || e.rank >= e.world_size) {
      throw LaunchEnvError(fmt::format("{}={} is not below {}={}", s.rank, e.rank, s.world_size,
                                       e.world_size));
    }
    return e;
  }
  return LaunchEnv{};
}

}  // namespace sana::dist
