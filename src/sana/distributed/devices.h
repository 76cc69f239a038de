// Which device each rank trains on, and the check that no two ranks of a host share one
// (the "Duplicate GPU detected" crash, turned into an error that says what to do).
// Pure logic over device lists: the torch side supplies the visible devices, tests
// inject them. Never includes torch.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "sana/distributed/launch_env.h"
#include "sana/distributed/options.h"
#include "sana/util/error.h"

namespace sana::dist {

// The devices this process can see: CUDA devices (by UUID, or by index when unknown),
// or none for CPU-only processes.
struct VisibleDevices {
  std::vector<std::string> cuda_ids;
  bool injected = false;  // RuntimeOptions::injected_cuda_devices (tests without a GPU)
};

struct DeviceClaim {
  int rank = 0;
  std::string host;
  std::string kind = "cpu";  // cpu | cuda
  int index = -1;            // CUDA device index as this process sees it
  std::string id;            // CUDA UUID (or "index N" when unknown)

  std::string encode() const;  // one line for the store
  static DeviceClaim decode(const std::string& text);
  std::string describe() const;  // "cuda:1 (GPU-ab12) on host node3"
};

// A device problem a user must fix before the run can start (exit code 2).
class DeviceError : public sana::UsageError {
 public:
  explicit DeviceError(const std::string& what) : UsageError(what, "device error") {}
};

// The device for this rank: cuda:LOCAL_RANK when CUDA devices are visible (or dist.device
// is cuda), else CPU. Throws DeviceError when LOCAL_RANK has no device of its own.
DeviceClaim choose_device(const LaunchEnv& env, const RuntimeOptions& cfg,
                          const VisibleDevices& visible, const std::string& host);

// Every pair of ranks on the same device of the same host, worded for the user; empty
// when the map is sound (CPU ranks never clash; allow_shared_device permits sharing).
std::vector<std::string> find_device_clashes(const std::vector<DeviceClaim>& claims,
                                             bool allow_shared_device);

// The backend for a claim: dist.backend, or for auto NCCL on CUDA when this build has it.
std::string choose_backend(const RuntimeOptions& cfg, const DeviceClaim& claim,
                           bool nccl_available);

// CPU threads for this process: dist.threads_per_process; else OMP_NUM_THREADS where it is set
// (`omp_num_threads` > 0: torchrun sets 1, and a test runner sharing the cores among its jobs
// sets its share); else the usable cores / processes on the host.
int threads_per_process(const RuntimeOptions& cfg, const LaunchEnv& env, unsigned cores, int omp_num_threads = 0);
// The cores this process may run on (its CPU affinity: taskset, cgroups' cpusets), and
// OMP_NUM_THREADS as a positive number (0 when unset or not one).
unsigned usable_cores();
int omp_num_threads_from_env();

}  // namespace sana::dist
