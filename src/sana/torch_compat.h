// Every difference between the LibTorch versions we build against, in one place: Debian
// 12's 1.13 (CPU) and 2.x (Debian trixie's 2.6, pip's and the official CUDA zips).
//   - c10d: 2.x process groups derive from c10d::Backend, 1.13's from c10d::ProcessGroup.
//   - TCPStoreOptions: 2.2+ has useLibUV (default true); Debian's 2.6 is built without
//     libuv, and a client must not wait for workers (our rendezvous counts ranks itself).
//   - autocast: 2.4+ has device-generic calls; 1.13 has CUDA-only ones.
//   - optional: c10::optional is its own type in 1.13 and std::optional in 2.x; API fields
//     of that type take compat::optional / c10::nullopt, which work with both.
// CUDA-only code (distributed/backend_cuda.cpp, train/device_feed_cuda.cpp) builds on both too:
// scripts/compat/cuda_syntax_check.sh checks it against 1.13's and 2.6's headers.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/util/Optional.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdint>

#define SANA_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace sana::compat {

template <class T>
using optional = c10::optional<T>;

// ---- c10d ---------------------------------------------------------------------------------

#if SANA_TORCH_AT_LEAST(2, 0)
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

inline c10d::TCPStoreOptions tcp_store_options(uint16_t port, bool server,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = server;
  o.numWorkers = c10::nullopt;
  o.waitWorkers = false;
  o.timeout = timeout;
#if SANA_TORCH_AT_LEAST(2, 2)
  o.useLibUV = false;
#endif
  return o;
}

// A barrier on NCCL runs an all-reduce on a device: name ours (cuda_index >= 0), or NCCL
// guesses one from the rank and may pick another process's GPU.
inline c10d::BarrierOptions barrier_options(int cuda_index) {
  c10d::BarrierOptions o;
  if (cuda_index >= 0) o.device_ids = {static_cast<int64_t>(cuda_index)};
  return o;
}

// ---- autocast (CUDA) ----------------------------------------------------------------------

inline bool cuda_autocast_enabled() {
#if SANA_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

inline at::ScalarType cuda_autocast_dtype() {
#if SANA_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(at::kCUDA);
#else
  return at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_cuda_autocast(bool enabled, at::ScalarType dtype) {
#if SANA_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
  at::autocast::set_enabled(enabled);
  at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

// ---- autocast (CPU) -----------------------------------------------------------------------

inline bool cpu_autocast_enabled() {
#if SANA_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}

inline void set_cpu_autocast(bool enabled) {
#if SANA_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
#else
  at::autocast::set_cpu_enabled(enabled);
#endif
}

inline at::ScalarType cpu_autocast_dtype() {
#if SANA_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(at::kCPU);
#else
  return at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_cpu_autocast_dtype(at::ScalarType dtype) {
#if SANA_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

}  // namespace sana::compat
