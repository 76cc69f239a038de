#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

#include "sana/distributed/backend_factory.h"
#include "sana/distributed/launch_env.h"

namespace sana::dist {

c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout, const std::string& ifname, const std::string& listen_host) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // The C++ API does not read GLOO_SOCKET_IFNAME for us (Python does).
  std::string iface = ifname;
  if (iface.empty()) {
    if (const char* env = std::getenv("GLOO_SOCKET_IFNAME")) iface = env;
  }
  if (!iface.empty()) {
    try {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
    } catch (const std::exception&) {
      throw LaunchEnvError(fmt::format(
          "network interface '{}' (from {}) has no address on this host; list interfaces with "
          "'ip addr' and set dist.socket_ifname or GLOO_SOCKET_IFNAME to one of them",
          iface, ifname.empty() ? "GLOO_SOCKET_IFNAME" : "dist.socket_ifname"));
    }
  } else if (!listen_host.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(listen_host));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

}  // namespace sana::dist
