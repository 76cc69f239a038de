// store_bind_host (store_server.h): where the store host listens.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sana/distributed/store_server.h"

namespace sana::dist {

namespace {

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
  }
  return false;
}

std::string host_only(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

}  // namespace

std::string store_bind_host(const std::string& master_host, std::string* note) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master_host.c_str(), nullptr, &hints, &found) != 0) {
    if (note) *note = fmt::format("the master address '{}' does not resolve here", master_host);
    return "";
  }
  std::vector<std::string> resolved;
  std::string loopback;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const std::string h = host_only(a->ai_addr, a->ai_addrlen);
    if (loopback.empty() && is_loopback(a->ai_addr)) loopback = h;
    resolved.push_back(h);
  }
  freeaddrinfo(found);
  if (!loopback.empty()) return loopback;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) {
        continue;
      }
      const socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      const std::string h = host_only(i->ifa_addr, len);
      if (std::find(resolved.begin(), resolved.end(), h) != resolved.end()) {
        freeifaddrs(ifs);
        return h;
      }
    }
    freeifaddrs(ifs);
  }
  if (note) {
    *note = fmt::format("the master address '{}' is not an address of this host; the store listens on every "
                        "interface (the run's token still guards it)",
                        master_host);
  }
  return "";
}

}  // namespace sana::dist
