// The CUDA side of backend_factory.h for LibTorch builds without CUDA.
#include <stdexcept>
#include <string>

#include "sana/distributed/backend_factory.h"

namespace sana::dist {

bool nccl_available() { return false; }

c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds) {
  throw std::runtime_error(
      "dist.backend is nccl but this LibTorch has no CUDA; use dist.backend=gloo, or build "
      "against a CUDA LibTorch (CMAKE_PREFIX_PATH)");
}

void use_cuda_device(int index) {
  throw std::runtime_error("cuda:" + std::to_string(index) +
                           " was chosen but this LibTorch has no CUDA; build against a CUDA LibTorch");
}

VisibleDevices visible_cuda_devices() { return {}; }

}  // namespace sana::dist
