#include "sana/distributed/store_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace sana::dist {

using namespace store_wire;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

// The server's answer that a wait or get ran out of time: the connection stays usable.
class WaitExpired : public StoreTimeout {
 public:
  using StoreTimeout::StoreTimeout;
};

std::string key_text(const std::string& key) { return key.empty() ? "" : fmt::format(" of '{}'", key); }

// One non-blocking connect attempt, bounded by `deadline`. Returns the socket or -1 with
// errno-like `error` set.
int try_connect(const addrinfo* a, Clock::time_point deadline, int& error) {
  const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    error = errno;
    return -1;
  }
  if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    error = errno;
    close(fd);
    return -1;
  }
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLOUT, 0};
    const int rc = poll(&p, 1, ms_until(deadline));
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0) {
      int so = 0;
      socklen_t len = sizeof so;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
      if (so == 0) return fd;
      error = so;
      close(fd);
      return -1;
    }
  }
  error = ETIMEDOUT;
  close(fd);
  return -1;
}

}  // namespace

StoreClient::StoreClient(std::string host, int port, std::string token, ms connect_timeout, ms timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  const auto deadline = Clock::now() + connect_timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
  if (rc != 0) throw StoreLost(fmt::format("cannot resolve the store host '{}': {}", host_, gai_strerror(rc)));
  int error = 0;
  // Refused or unreachable: the store host may not be up yet; try again until the deadline.
  while (fd_ < 0) {
    for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) fd_ = try_connect(a, deadline, error);
    if (fd_ >= 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - Clock::now()));
  }
  freeaddrinfo(found);
  if (fd_ < 0) {
    throw StoreTimeout(fmt::format("could not connect to the store at {} within {} s (last error: {})", where(),
                                   seconds(connect_timeout), std::strerror(error)));
  }
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_storage mine{};
  socklen_t len = sizeof mine;
  char text[NI_MAXHOST] = {};
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&mine), &len) == 0 &&
      getnameinfo(reinterpret_cast<sockaddr*>(&mine), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
    local_address_ = text;
  }
  const auto left = std::chrono::duration_cast<ms>(deadline - Clock::now());
  try {
    call(FrameWriter(static_cast<uint8_t>(Op::hello)).field(std::string(kProtocol)).field(token).take(), "hello",
         "", std::max(left, ms(1000)));
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const StoreTimeout*>(&e) || dynamic_cast<const StoreLost*>(&e)) throw;
    throw StoreRefused(fmt::format("the store at {} refused this process: {}", where(), e.what()));
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) close(fd_);
}

std::string StoreClient::where() const {
  return host_.find(':') != std::string::npos ? fmt::format("[{}]:{}", host_, port_)
                                               : fmt::format("{}:{}", host_, port_);
}

void StoreClient::lose(const std::string& why) {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  lost_ = why;
  throw StoreLost(why);
}

void StoreClient::time_out(const std::string& why) {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  lost_ = why;
  throw StoreTimeout(why);
}

void StoreClient::send_all(const Bytes& frame, Clock::time_point deadline, const char* what,
                           const std::string& key) {
  size_t at = 0;
  while (at < frame.size()) {
    const ssize_t n = send(fd_, frame.data() + at, frame.size() - at, MSG_NOSIGNAL);
    if (n > 0) {
      at += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() >= deadline) {
        time_out(fmt::format("the store at {} took no more of a {}{} for {} s", where(), what, key_text(key),
                             seconds(call_limit_)));
      }
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, ms_until(deadline));
      continue;
    }
    lose(fmt::format("the connection to the store at {} failed during a {}{}: {}", where(), what, key_text(key),
                     std::strerror(errno)));
  }
}

void StoreClient::recv_exact(uint8_t* p, size_t n, Clock::time_point deadline, const char* what,
                             const std::string& key) {
  size_t at = 0;
  while (at < n) {
    const ssize_t got = recv(fd_, p + at, n - at, 0);
    if (got > 0) {
      at += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) {
      lose(fmt::format("the store at {} closed the connection during a {}{}", where(), what, key_text(key)));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      lose(fmt::format("the connection to the store at {} failed during a {}{}: {}", where(), what, key_text(key),
                       std::strerror(errno)));
    }
    if (Clock::now() >= deadline) {
      time_out(fmt::format("no answer from the store at {} to a {}{} within {} s (Socket Timeout)", where(), what,
                           key_text(key), seconds(call_limit_)));
    }
    pollfd pf{fd_, POLLIN, 0};
    poll(&pf, 1, ms_until(deadline));
  }
}

StoreClient::Bytes StoreClient::call(Bytes frame, const char* what, const std::string& key, ms limit) {
  if (fd_ < 0) throw StoreLost(lost_.empty() ? "not connected to the store" : lost_);
  call_limit_ = limit;
  const auto deadline = Clock::now() + limit;
  send_all(frame, deadline, what, key);
  uint8_t head[4];
  recv_exact(head, 4, deadline, what, key);
  const uint32_t size = read_le32(head);
  if (size == 0 || size > kMaxFrame) {
    lose(fmt::format("the store at {} sent a malformed reply ({} bytes) to a {}", where(), size, what));
  }
  Bytes body(size);
  recv_exact(body.data(), size, deadline, what, key);
  const auto status = static_cast<Status>(body[0]);
  body.erase(body.begin());
  if (status == Status::ok) return body;
  if (status == Status::timeout) throw WaitExpired("the wait expired");
  FrameReader r(body.data(), body.size());
  throw std::runtime_error(r.text().value_or("the store reported an error"));
}

namespace {

int64_t integer_of(const StoreClient::Bytes& body) {
  FrameReader r(body.data(), body.size());
  const auto v = r.integer();
  if (!v) throw std::runtime_error("the store sent a malformed reply");
  return *v;
}

}  // namespace

void StoreClient::set(const std::string& key, const Bytes& value) {
  call(FrameWriter(static_cast<uint8_t>(Op::set)).field(key).field(value).take(), "set", key, timeout_);
}

StoreClient::Bytes StoreClient::get(const std::string& key, ms wait) {
  try {
    const Bytes body = call(FrameWriter(static_cast<uint8_t>(Op::get)).field(key).integer(wait.count()).take(),
                            "get", key, wait + kAnswerMargin);
    FrameReader r(body.data(), body.size());
    auto value = r.bytes();
    if (!value) throw std::runtime_error("the store sent a malformed reply");
    return std::move(*value);
  } catch (const WaitExpired&) {
    throw StoreTimeout(fmt::format("timed out after {} s waiting for key '{}' in the store at {}", seconds(wait), key,
                                   where()));
  }
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  return integer_of(call(FrameWriter(static_cast<uint8_t>(Op::add)).field(key).integer(delta).take(), "add", key,
                         timeout_));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  FrameWriter f(static_cast<uint8_t>(Op::check));
  for (const auto& k : keys) f.field(k);
  return integer_of(call(f.take(), "check", keys.empty() ? "" : keys.front(), timeout_)) != 0;
}

StoreClient::Bytes StoreClient::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const Bytes body = call(FrameWriter(static_cast<uint8_t>(Op::compare_set)).field(key).field(expected).field(desired).take(),
                          "compare-set", key, timeout_);
  FrameReader r(body.data(), body.size());
  auto value = r.bytes();
  if (!value) throw std::runtime_error("the store sent a malformed reply");
  return std::move(*value);
}

bool StoreClient::erase(const std::string& key) {
  return integer_of(call(FrameWriter(static_cast<uint8_t>(Op::erase)).field(key).take(), "delete", key, timeout_)) != 0;
}

int64_t StoreClient::age_ms(const std::string& key) {
  return integer_of(call(FrameWriter(static_cast<uint8_t>(Op::age)).field(key).take(), "age", key, timeout_));
}

int64_t StoreClient::num_keys() {
  return integer_of(call(FrameWriter(static_cast<uint8_t>(Op::num_keys)).take(), "key count", "", timeout_));
}

void StoreClient::wait(const std::vector<std::string>& keys, ms wait) {
  FrameWriter f(static_cast<uint8_t>(Op::wait));
  f.integer(wait.count());
  for (const auto& k : keys) f.field(k);
  try {
    call(f.take(), "wait", keys.empty() ? "" : keys.front(), wait + kAnswerMargin);
  } catch (const WaitExpired&) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!check({k})) missing.push_back("'" + k + "'");
    }
    throw StoreTimeout(fmt::format("timed out after {} s waiting for {} in the store at {}", seconds(wait),
                                   missing.empty() ? "keys" : fmt::format("{}", fmt::join(missing, ", ")), where()));
  }
}

}  // namespace sana::dist
