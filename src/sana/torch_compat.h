// The few LibTorch calls that read better under our own names, in one place. sana-train builds
// against one LibTorch, pip's torch 2.11 with CUDA (python/requirements.lock; README,
// "Requirements"); the shims that bridged Debian 12's 1.13 and trixie's 2.6 are gone.
//   - TCPStoreOptions: a client must not wait for workers (our rendezvous counts ranks itself),
//     and the store runs without libuv, as it always has here.
//   - A barrier on NCCL names its device.
//   - autocast: the device-generic calls, by device.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <optional>

#define SANA_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(SANA_TORCH_AT_LEAST(2, 11), "sana-train builds against LibTorch 2.11 or later (README, Requirements)");

namespace sana::compat {

template <class T>
using optional = std::optional<T>;

// ---- c10d ---------------------------------------------------------------------------------

using CollectiveBackend = c10d::Backend;

inline c10d::TCPStoreOptions tcp_store_options(uint16_t port, bool server,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = server;
  o.numWorkers = std::nullopt;
  o.waitWorkers = false;
  o.timeout = timeout;
  o.useLibUV = false;
  return o;
}

// A barrier on NCCL runs an all-reduce on a device: name ours (cuda_index >= 0), or NCCL
// guesses one from the rank and may pick another process's GPU.
inline c10d::BarrierOptions barrier_options(int cuda_index) {
  c10d::BarrierOptions o;
  if (cuda_index >= 0) o.device_ids = {static_cast<int64_t>(cuda_index)};
  return o;
}

// ---- autocast -----------------------------------------------------------------------------

inline bool cuda_autocast_enabled() { return at::autocast::is_autocast_enabled(at::kCUDA); }
inline at::ScalarType cuda_autocast_dtype() { return at::autocast::get_autocast_dtype(at::kCUDA); }

inline void set_cuda_autocast(bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
}

inline bool cpu_autocast_enabled() { return at::autocast::is_autocast_enabled(at::kCPU); }
inline void set_cpu_autocast(bool enabled) { at::autocast::set_autocast_enabled(at::kCPU, enabled); }
inline at::ScalarType cpu_autocast_dtype() { return at::autocast::get_autocast_dtype(at::kCPU); }
inline void set_cpu_autocast_dtype(at::ScalarType dtype) { at::autocast::set_autocast_dtype(at::kCPU, dtype); }

}  // namespace sana::compat
