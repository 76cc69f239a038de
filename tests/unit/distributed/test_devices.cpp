// The device map: which GPU each rank takes, and the errors that replace
// "Duplicate GPU detected" (devices are injected: no GPU needed).
#include "catch.h"

#include <cstdlib>
#include <string>

#include "sana/distributed/devices.h"
#include "sana/distributed/launch_env.h"
#include "sana/distributed/launcher.h"

using namespace sana::dist;

namespace {
LaunchEnv local(int rank, int local_world) {
  LaunchEnv e;
  e.launcher = "torchrun";
  e.rank = rank;
  e.world_size = local_world;
  e.local_rank = rank;
  e.local_world_size = local_world;
  return e;
}
VisibleDevices gpus(std::vector<std::string> ids) { return VisibleDevices{std::move(ids), true}; }
}  // namespace

TEST_CASE("each process takes cuda:LOCAL_RANK", "[devices]") {
  RuntimeOptions cfg;
  const auto c = choose_device(local(1, 2), cfg, gpus({"GPU-a", "GPU-b"}), "n1");
  CHECK(c.kind == "cuda");
  CHECK(c.index == 1);
  CHECK(c.id == "GPU-b");
  CHECK(choose_backend(cfg, c, true) == "nccl");
  CHECK(choose_backend(cfg, c, false) == "gloo");
  CHECK(choose_device(local(0, 1), cfg, gpus({}), "n1").kind == "cpu");
}

TEST_CASE("more processes than GPUs is an error naming the rank and the fix", "[devices]") {
  RuntimeOptions cfg;
  CHECK_THROWS_WITH(choose_device(local(1, 2), cfg, gpus({"GPU-a"}), "colab"),
                    Catch::Contains("rank 1 (LOCAL_RANK 1) has no GPU of its own") &&
                        Catch::Contains("2 processes were started on host colab") &&
                        Catch::Contains("dist.allow_shared_device=true"));
  cfg.allow_shared_device = true;
  cfg.backend = BackendChoice::gloo;
  const auto c = choose_device(local(1, 2), cfg, gpus({"GPU-a"}), "colab");
  CHECK(c.index == 0);
  cfg.device = DeviceChoice::cuda;
  CHECK_THROWS_WITH(choose_device(local(0, 1), cfg, gpus({}), "n1"),
                    Catch::Contains("sees no CUDA device"));
}

TEST_CASE("two ranks on one device of one host clash, other hosts and CPUs do not", "[devices]") {
  auto claim = [](int rank, std::string host, std::string id) {
    DeviceClaim c;
    c.rank = rank;
    c.host = std::move(host);
    c.kind = "cuda";
    c.index = 0;
    c.id = std::move(id);
    return c;
  };
  std::vector<DeviceClaim> map = {claim(0, "a", "GPU-1"), claim(1, "a", "GPU-2"),
                                  claim(2, "b", "GPU-1"), claim(3, "a", "GPU-1")};
  DeviceClaim cpu;
  cpu.rank = 4;
  cpu.host = "a";
  map.push_back(cpu);
  map.push_back(cpu);
  const auto clashes = find_device_clashes(map, false);
  REQUIRE(clashes.size() == 1);
  CHECK(clashes[0].find("rank 0 (cuda:0) and rank 3 (cuda:0) are both on GPU GPU-1 of host a") !=
        std::string::npos);
  CHECK(find_device_clashes(map, true).empty());
  CHECK(DeviceClaim::decode(map[3].encode()).describe() == map[3].describe());
}

TEST_CASE("CPU threads default to the cores shared by the processes of a host", "[devices]") {
  RuntimeOptions cfg;
  CHECK(threads_per_process(cfg, local(0, 2), 16) == 8);
  CHECK(threads_per_process(cfg, local(0, 4), 2) == 1);
  CHECK(threads_per_process(cfg, local(0, 2), 16, /*omp_num_threads=*/1) == 1);  // OMP_NUM_THREADS=1 (torchrun)
  cfg.threads_per_process = 3;
  CHECK(threads_per_process(cfg, local(0, 4), 2) == 3);
  CHECK(threads_per_process(cfg, local(0, 4), 2, 1) == 3);  // the key wins over the variable
  CHECK(usable_cores() >= 1);
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before ? before : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  CHECK(omp_num_threads_from_env() == 3);
  setenv("OMP_NUM_THREADS", "two", 1);
  CHECK(omp_num_threads_from_env() == 0);
  unsetenv("OMP_NUM_THREADS");
  CHECK(omp_num_threads_from_env() == 0);
  if (before != nullptr) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
}

TEST_CASE("launch options that cannot work are usage errors", "[launcher]") {
  LaunchOptions o;
  o.program = "/bin/true";
  CHECK(check_launch_options(o).empty());
  o.nnodes = 2;
  CHECK(check_launch_options(o).find("--master-port is required") != std::string::npos);
  o.master_port = 29500;
  CHECK(check_launch_options(o).find("--master-addr must be node 0's address") != std::string::npos);
  o.master_addr = "node0";
  o.node_rank = 2;
  CHECK(check_launch_options(o).find("--node-rank must be in [0, 2)") != std::string::npos);
  o = LaunchOptions{};
  CHECK(check_launch_options(o).find("nothing to run") != std::string::npos);
}
