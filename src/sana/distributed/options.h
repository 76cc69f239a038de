// What the distributed runtime starts with (distributed/runtime.h, devices.h): the
// dist.* keys, by the same names; train/options/core_options.h fills them from the run's
// config. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sana::dist {

enum class BackendChoice { automatic, gloo, nccl };
enum class DeviceChoice { automatic, cpu, cuda };

struct RuntimeOptions {
  BackendChoice backend = BackendChoice::automatic;  // automatic: NCCL on CUDA where built, else Gloo
  DeviceChoice device = DeviceChoice::automatic;     // automatic: CUDA when devices are visible
  std::string master_addr;
  int64_t master_port = 0;            // 0: from the launcher's environment, else 29500
  double timeout_s = 300.0;           // every wait of start-up and of each collective
  double heartbeat_timeout_s = 30.0;  // a rank silent this long is declared dead
  std::string socket_ifname;
  bool allow_shared_device = false;   // debugging only: several ranks on one GPU (gloo)
  int64_t threads_per_process = 0;    // CPU threads; 0 = cores / processes on the host
  // dist.elastic continue: a lost rank (dead or hung) leaves the group instead of ending the
  // run (Runtime::regroup); dist.min_world_size.
  bool elastic_continue = false;
  int64_t min_world_size = 1;
  double max_rejoin_wait_s = 600;  // a replacement waits this long at most to be taken in
  // Tests without a GPU: these stand in for the visible CUDA devices when
  // `inject_cuda_devices` (the fault-injection hooks of train/test_hooks.h set them).
  bool inject_cuda_devices = false;
  std::vector<std::string> injected_cuda_devices;
};

}  // namespace sana::dist
