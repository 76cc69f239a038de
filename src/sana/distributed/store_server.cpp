#include "sana/distributed/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "sana/util/log.h"

namespace sana::dist {

using namespace store_wire;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kRefusalsKept = 16;
constexpr int64_t kRefusalsLogged = 5;
constexpr uint32_t kMaxHelloFrame = 4096;  // before hello: nothing bigger is read

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string numeric_address(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = {}, serv[NI_MAXSERV] = {};
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return sa->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, serv) : fmt::format("{}:{}", host, serv);
}

bool same_token(const std::string& given, const std::string& want) {
  // Constant time in the contents: a foreign client learns nothing from how long it took.
  if (want.empty() || given.size() != want.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i]);
  return diff == 0;
}

Bytes status_frame(Status s) { return FrameWriter(static_cast<uint8_t>(s)).take(); }

Bytes error_frame(const std::string& message) {
  return FrameWriter(static_cast<uint8_t>(Status::error)).field(message).take();
}

}  // namespace

StoreServer::StoreServer(StoreServerOptions options) : options_(std::move(options)) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options_.port);
  const int rc = getaddrinfo(options_.bind_host.empty() ? nullptr : options_.bind_host.c_str(),
                             port_text.c_str(), &hints, &found);
  const std::string where = fmt::format("{}:{}", options_.bind_host.empty() ? "*" : options_.bind_host, options_.port);
  if (rc != 0) throw std::runtime_error(fmt::format("cannot listen on {}: {}", where, gai_strerror(rc)));
  // Every interface: prefer IPv6 with IPv4 mapped in, so both kinds reach it.
  std::vector<addrinfo*> order;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) order.push_back(a);
  if (options_.bind_host.empty()) {
    std::stable_partition(order.begin(), order.end(), [](addrinfo* a) { return a->ai_family == AF_INET6; });
  }
  std::string last_error = "no address";
  for (addrinfo* a : order) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6 && options_.bind_host.empty()) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      address_ = numeric_address(reinterpret_cast<sockaddr*>(&bound), len);
      port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) throw std::runtime_error(fmt::format("cannot listen on {}: {}", where, last_error));
  set_nonblocking(listen_fd_);
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listen_fd_);
    throw std::runtime_error(fmt::format("cannot start the store's thread: {}", std::strerror(errno)));
  }
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  const char c = 'x';
  (void)!write(wake_pipe_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  for (auto& [id, c] : conns_) close(c.fd);
  close(listen_fd_);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
}

std::chrono::steady_clock::duration StoreServer::idle() const {
  return Clock::now().time_since_epoch() - Clock::duration(last_request_.load());
}

std::vector<std::string> StoreServer::refusals() const {
  std::lock_guard<std::mutex> lock(refusals_mutex_);
  return {refusals_.begin(), refusals_.end()};
}

void StoreServer::serve() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.clear();
    ids.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    auto next = Clock::now() + std::chrono::seconds(1);
    for (auto& [id, c] : conns_) {
      short events = 0;
      // A parked connection is read too (its requests wait in `in`): so a client that
      // gives up and closes is forgotten at once.
      if (!c.close_after) events |= POLLIN;
      if (c.out_at < c.out.size()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
      ids.push_back(id);
      if (!c.authed) next = std::min(next, c.hello_deadline);
    }
    for (const auto& w : waiters_) next = std::min(next, w.deadline);
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    if (poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms + 1, 0, 1000))) < 0 &&
        errno != EINTR) {
      log::error("the run's store stopped serving: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // stopping
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = conns_.find(ids[i - 2]);
      if (it == conns_.end()) continue;
      Conn& c = it->second;
      if (fds[i].revents & POLLOUT) flush(c);
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(it->first, c);
    }
    const auto now = Clock::now();
    expire(now);
    std::vector<uint64_t> gone;
    for (auto& [id, c] : conns_) {
      if (!c.authed && c.fd >= 0 && now > c.hello_deadline) {
        refuse(c, fmt::format("no hello within {} s", options_.hello_limit.count() / 1000.0));
      }
      if (c.fd < 0 || (c.close_after && c.out_at >= c.out.size())) gone.push_back(id);
    }
    for (uint64_t id : gone) close_conn(id);
  }
}

void StoreServer::accept_all() {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or out of descriptors: the rest wait in the backlog
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    c.peer = numeric_address(reinterpret_cast<sockaddr*>(&peer), len);
    c.hello_deadline = Clock::now() + options_.hello_limit;
    conns_.emplace(next_conn_++, std::move(c));
  }
}

void StoreServer::read_from(uint64_t id, Conn& c) {
  uint8_t chunk[65536];
  for (;;) {
    const ssize_t n = recv(c.fd, chunk, sizeof chunk, 0);
    if (n > 0) {
      c.in.insert(c.in.end(), chunk, chunk + n);
      if (c.in.size() >= 4) {
        const uint32_t want = read_le32(c.in.data());
        const uint32_t limit = c.authed ? kMaxFrame : kMaxHelloFrame;
        if (want > limit) {
          if (!c.authed) {
            refuse(c, fmt::format("a first frame of {} bytes (not a sana-train rank)", want));
          } else {
            log::warn("the run's store closed the connection of {}: a frame of {} bytes is over the limit of {}",
                      c.peer, want, limit);
            close_conn(id);
          }
          return;
        }
      }
      handle_frames(id, c);
      if (c.fd < 0 || c.close_after) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    // The peer closed (or reset) the connection: forget it and its waits.
    close(c.fd);
    c.fd = -1;
    return;
  }
}

void StoreServer::handle_frames(uint64_t id, Conn& c) {
  size_t at = 0;
  while (c.fd >= 0 && !c.parked && !c.close_after && c.in.size() - at >= 4) {
    const uint32_t want = read_le32(c.in.data() + at);
    if (want > (c.authed ? kMaxFrame : kMaxHelloFrame)) break;  // read_from refuses it
    if (c.in.size() - at - 4 < want) break;
    handle(id, c, c.in.data() + at + 4, want);
    at += 4 + want;
  }
  if (c.fd >= 0) c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(at));
}

void StoreServer::handle(uint64_t id, Conn& c, const uint8_t* body, size_t size) {
  if (!c.authed) {
    FrameReader r(body, size);
    const auto op = r.head();
    if (!op || static_cast<Op>(*op) != Op::hello) return refuse(c, "a request before hello (not a sana-train rank)");
    const auto protocol = r.text();
    const auto token = r.text();
    if (!protocol || *protocol != kProtocol || !token) return refuse(c, "not the sana-train store protocol");
    if (!same_token(*token, options_.token)) {
      return refuse(c, "wrong run token (SANA_RUN_TOKEN differs from the store host's)");
    }
    c.authed = true;
    ++clients_;
    last_request_ = Clock::now().time_since_epoch().count();
    return reply(c, status_frame(Status::ok));
  }
  last_request_ = Clock::now().time_since_epoch().count();
  StoreData::Outcome o = data_.apply(body, size);
  switch (o.kind) {
    case StoreData::Outcome::Kind::reply:
      reply(c, std::move(o.frame));
      if (o.changed) wake_waiters();
      return;
    case StoreData::Outcome::Kind::park: {
      Waiter w;
      w.conn = id;
      w.op = o.op;
      w.keys = std::move(o.keys);
      w.deadline = Clock::now() + std::chrono::milliseconds(o.timeout_ms);
      c.parked = true;
      waiters_.push_back(std::move(w));
      return;
    }
    case StoreData::Outcome::Kind::malformed:
      log::warn("the run's store closed the connection of {}: a malformed request", c.peer);
      close(c.fd);
      c.fd = -1;
      return;
  }
}

void StoreServer::wake_waiters() {
  settle_waiters([this](const Waiter& w) -> std::optional<Bytes> {
    if (!data_.has_all(w.keys)) return std::nullopt;
    return data_.answer(w.op, w.keys);
  });
}

void StoreServer::expire(Clock::time_point now) {
  settle_waiters([now](const Waiter& w) -> std::optional<Bytes> {
    if (now < w.deadline) return std::nullopt;
    return status_frame(Status::timeout);
  });
}

template <class Answer>
void StoreServer::settle_waiters(Answer&& answer) {
  std::vector<uint64_t> woken;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    auto conn = conns_.find(it->conn);
    if (conn == conns_.end() || conn->second.fd < 0) {
      it = waiters_.erase(it);
      continue;
    }
    std::optional<Bytes> frame = answer(*it);
    if (!frame) {
      ++it;
      continue;
    }
    conn->second.parked = false;
    reply(conn->second, std::move(*frame));
    woken.push_back(it->conn);
    it = waiters_.erase(it);
  }
  // A woken connection may already have its next request buffered.
  for (uint64_t id : woken) {
    auto conn = conns_.find(id);
    if (conn != conns_.end() && conn->second.fd >= 0) handle_frames(id, conn->second);
  }
}

void StoreServer::reply(Conn& c, Bytes frame) {
  if (c.fd < 0) return;
  if (c.out_at >= c.out.size()) {
    c.out = std::move(frame);
    c.out_at = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  flush(c);
}

void StoreServer::flush(Conn& c) {
  while (c.fd >= 0 && c.out_at < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_at += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the rest when poll says it can go
    } else {
      close(c.fd);
      c.fd = -1;
    }
  }
  if (c.out_at >= c.out.size()) {
    c.out.clear();
    c.out_at = 0;
  }
}

void StoreServer::refuse(Conn& c, const std::string& reason) {
  const std::string what = fmt::format("{}: {}", c.peer, reason);
  const int64_t n = ++refused_;
  {
    std::lock_guard<std::mutex> lock(refusals_mutex_);
    refusals_.push_back(what);
    if (refusals_.size() > kRefusalsKept) refusals_.pop_front();
  }
  if (n <= kRefusalsLogged) {
    log::warn("the run's store refused a connection from {}{}", what,
              n == kRefusalsLogged ? " (further refusals are counted, not logged)" : "");
  }
  // `in` stays as it is: handle_frames may be in the middle of it; nothing more is read.
  reply(c, error_frame(reason));
  c.close_after = true;
}

void StoreServer::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  if (it->second.fd >= 0) close(it->second.fd);
  if (it->second.authed) --clients_;
  conns_.erase(it);
  waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), [id](const Waiter& w) { return w.conn == id; }),
                 waiters_.end());
}

}  // namespace sana::dist
