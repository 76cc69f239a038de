// The CUDA side of backend_factory.h: NCCL and the CUDA device list (CUDA builds only).
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "sana/distributed/backend_factory.h"
#include "sana/distributed/nccl_env.h"
#include "sana/util/log.h"

namespace sana::dist {

bool nccl_available() { return true; }

c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout) {
  const auto env = apply_nccl_defaults(/*torch_aborts_by_default=*/true);
  if (rank == 0) {
    log::info("NCCL environment: {}{}", env.variables.empty() ? "LibTorch's defaults" : fmt::format("{}", fmt::join(env.variables, " ")),
              env.set_by_us.empty() ? "" : fmt::format(" (set by sana-train: {})", fmt::join(env.set_by_us, " ")));
    if (!env.warning.empty()) log::warn("{}", env.warning);
  }
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
}

void use_cuda_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }

VisibleDevices visible_cuda_devices() {
  VisibleDevices v;
  const int count = static_cast<int>(c10::cuda::device_count());
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      v.cuda_ids.push_back(fmt::format("index {}", i));
      continue;
    }
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    v.cuda_ids.push_back(fmt::format(
        "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
        u[14], u[15]));
  }
  return v;
}

}  // namespace sana::dist
