// Every difference between the LibTorch versions we build against, in one place:
// Debian 12's 1.13 (CPU) and 2.x (e.g. Debian trixie's 2.6, with or without CUDA).
// Facts: 2.x process groups derive from c10d::Backend instead of c10d::ProcessGroup;
// 2.x TCPStoreOptions has useLibUV (default true), and Debian's 2.6 has no libuv.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdint>

#define SANA_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace sana::dist::compat {

#if SANA_TORCH_AT_LEAST(2, 0)
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

// Our rendezvous counts ranks itself (failure-aware), so stores never wait for workers.
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

}  // namespace sana::dist::compat
