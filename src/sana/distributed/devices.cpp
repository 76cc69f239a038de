#include "sana/distributed/devices.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>

namespace sana::dist {

std::string DeviceClaim::encode() const {
  return fmt::format("{}\t{}\t{}\t{}\t{}", rank, host, kind, index, id);
}

DeviceClaim DeviceClaim::decode(const std::string& text) {
  DeviceClaim c;
  std::stringstream in(text);
  std::string rank, index;
  std::getline(in, rank, '\t');
  std::getline(in, c.host, '\t');
  std::getline(in, c.kind, '\t');
  std::getline(in, index, '\t');
  std::getline(in, c.id);
  c.rank = std::atoi(rank.c_str());
  c.index = std::atoi(index.c_str());
  return c;
}

std::string DeviceClaim::describe() const {
  if (kind == "cpu") return fmt::format("cpu on host {}", host);
  return fmt::format("cuda:{} ({}) on host {}", index, id, host);
}

DeviceClaim choose_device(const LaunchEnv& env, const RuntimeOptions& cfg,
                          const VisibleDevices& visible, const std::string& host) {
  DeviceClaim c;
  c.rank = env.rank;
  c.host = host;
  const int count = static_cast<int>(visible.cuda_ids.size());
  const bool want_cuda =
      cfg.device == DeviceChoice::cuda || (cfg.device == DeviceChoice::automatic && count > 0);
  if (!want_cuda) return c;
  if (count == 0) {
    throw DeviceError(fmt::format(
        "rank {}: dist.device is cuda but this process sees no CUDA device on host {} (check "
        "CUDA_VISIBLE_DEVICES and the driver), or set dist.device=cpu",
        env.rank, host));
  }
  c.kind = "cuda";
  c.index = env.local_rank;
  if (env.local_rank >= count) {
    if (!cfg.allow_shared_device) {
      throw DeviceError(fmt::format(
          "rank {} (LOCAL_RANK {}) has no GPU of its own: {} processes were started on host {} "
          "but only {} CUDA device{} {} visible. Start at most {} process{} per node (e.g. "
          "--nproc-per-node {}), or for debugging only set dist.backend=gloo and "
          "dist.allow_shared_device=true",
          env.rank, env.local_rank, env.local_world_size, host, count, count == 1 ? "" : "s",
          count == 1 ? "is" : "are", count, count == 1 ? "" : "es", count));
    }
    c.index = env.local_rank % count;
  }
  c.id = visible.cuda_ids[static_cast<size_t>(c.index)];
  return c;
}

std::vector<std::string> find_device_clashes(const std::vector<DeviceClaim>& claims,
                                             bool allow_shared_device) {
  std::vector<std::string> out;
  if (allow_shared_device) return out;
  std::map<std::pair<std::string, std::string>, const DeviceClaim*> owner;
  for (const auto& c : claims) {
    if (c.kind != "cuda") continue;
    auto [it, fresh] = owner.emplace(std::make_pair(c.host, c.id), &c);
    if (fresh) continue;
    const DeviceClaim& first = *it->second;
    out.push_back(fmt::format(
        "rank {} (cuda:{}) and rank {} (cuda:{}) are both on GPU {} of host {}: each rank needs "
        "its own GPU. Start fewer processes per node, check CUDA_VISIBLE_DEVICES and LOCAL_RANK, "
        "or for debugging only set dist.backend=gloo and dist.allow_shared_device=true",
        first.rank, first.index, c.rank, c.index, c.id, c.host));
  }
  return out;
}

std::string choose_backend(const RuntimeOptions& cfg, const DeviceClaim& claim,
                           bool nccl_available) {
  if (cfg.backend != BackendChoice::automatic) return cfg.backend == BackendChoice::nccl ? "nccl" : "gloo";
  return claim.kind == "cuda" && nccl_available && !cfg.allow_shared_device ? "nccl" : "gloo";
}

int threads_per_process(const RuntimeOptions& cfg, const LaunchEnv& env, unsigned cores, int omp_num_threads) {
  if (cfg.threads_per_process > 0) return static_cast<int>(cfg.threads_per_process);
  // More threads than cores is never faster: LibTorch's OpenMP pool then waits at every
  // parallel region for a thread the kernel has descheduled (two 2-thread processes on 2
  // cores: a 40-step tiny run and a float64 check took 220 s together, 19 s at 1 thread each).
  if (omp_num_threads > 0) return omp_num_threads;
  const int per = static_cast<int>(cores) / std::max(1, env.local_world_size);
  return std::max(1, per);
}

unsigned usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<unsigned>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int omp_num_threads_from_env() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end != v && *end == '\0' && n > 0 && n < 1 << 16) ? static_cast<int>(n) : 0;
}

}  // namespace sana::dist
