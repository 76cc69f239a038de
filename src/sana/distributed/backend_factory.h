// Creates collective backends. Gloo is always there; NCCL and the CUDA device list come
// from backend_cuda.cpp in CUDA builds and from backend_cpu_only.cpp otherwise (CMake
// picks one), so no other file needs an #ifdef.
#pragma once

#include <chrono>
#include <string>

#include "sana/torch_compat.h"
#include "sana/distributed/devices.h"

namespace sana::dist {

// Gloo over the interface `ifname` (or GLOO_SOCKET_IFNAME), else listening on
// `listen_host` (loopback when every rank is on this host, else the address that reaches
// the store host), else ("") on the address this host's name resolves to.
c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout, const std::string& ifname, const std::string& listen_host);

bool nccl_available();

// Makes cuda:`index` this process's current device, before any NCCL communicator or CUDA
// tensor exists (else every process starts a context on GPU 0).
void use_cuda_device(int index);

// NCCL with `timeout` per collective; applies distributed/nccl_env.h's defaults first and logs the
// NCCL variables in force (rank 0).
c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout);

// The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies), by UUID.
VisibleDevices visible_cuda_devices();

}  // namespace sana::dist
