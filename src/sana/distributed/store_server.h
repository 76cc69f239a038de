// The run's key-value store, served by rank 0 on a thread of its own (the rendezvous,
// the failure watch's heartbeats and Gloo's address exchange all go through it).
// Plain POSIX; never includes torch.
//
// Why not LibTorch's TCPStore server: it reads each request to its end before it serves
// the next connection, so one client stopped halfway through sending a request (SIGSTOP,
// a cut link) wedges the store for every rank, and all of them then blame rank 0. This
// server reads every connection without blocking (poll, one buffer per connection) and
// serves whole requests only.
//
// Who may connect: the server listens on one address (loopback for a single-host run),
// and a connection must first say `hello` with the run's token; until then it can
// neither read nor change a key. A wrong token, a malformed or oversized frame, or no
// hello within the limit closes the connection and is counted (refusals()).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sana/distributed/store_data.h"
#include "sana/distributed/store_protocol.h"

namespace sana::dist {

struct StoreServerOptions {
  std::string bind_host;  // an address of this host; "" listens on every interface
  int port = 0;           // 0: any free port (see StoreServer::port())
  std::string token;      // the run's token: every connection must present it
  std::chrono::milliseconds hello_limit{10000};  // a connection must say hello within this
};

// Where the store host listens for a store reached at `master_host`: a loopback master
// (a single-host run) listens on that loopback address only, a master address of one of
// this host's interfaces on that address only. A master address that is none of this
// host's (NAT, a container's published port) listens on every interface: returns "" and
// says why in `note`.
std::string store_bind_host(const std::string& master_host, std::string* note);

class StoreServer {
 public:
  // Listens (throws std::runtime_error naming the address and the reason if it cannot)
  // and serves on a thread of its own until destroyed.
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // "address:port" as bound.
  const std::string& address() const { return address_; }
  // Connections that said hello and are still open (the run's processes still there).
  int clients() const { return clients_.load(); }
  // Since the last request of any of them (or the start): how long nobody asked anything.
  std::chrono::steady_clock::duration idle() const;
  // Connections refused so far, and the last few reasons ("198.18.0.2:40112: wrong token").
  int64_t refused() const { return refused_.load(); }
  std::vector<std::string> refusals() const;

 private:
  struct Conn {
    int fd = -1;
    std::string peer;
    store_wire::Bytes in;
    store_wire::Bytes out;
    size_t out_at = 0;
    bool authed = false;
    bool parked = false;        // waiting for keys: its next request is not handled yet
    bool close_after = false;   // close once `out` is sent
    std::chrono::steady_clock::time_point hello_deadline;
  };
  struct Waiter {
    uint64_t conn = 0;
    store_wire::Op op = store_wire::Op::wait;
    std::vector<std::string> keys;
    std::chrono::steady_clock::time_point deadline;
  };

  void serve();
  void accept_all();
  void read_from(uint64_t id, Conn& c);
  void handle_frames(uint64_t id, Conn& c);
  void handle(uint64_t id, Conn& c, const uint8_t* body, size_t size);
  void reply(Conn& c, store_wire::Bytes frame);
  void flush(Conn& c);
  void refuse(Conn& c, const std::string& reason);
  void wake_waiters();
  void expire(std::chrono::steady_clock::time_point now);
  // Answers each waiter for which `answer` gives a reply frame; forgets those of closed
  // connections.
  template <class Answer>
  void settle_waiters(Answer&& answer);
  void close_conn(uint64_t id);

  StoreServerOptions options_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::string address_;
  std::thread thread_;

  // Touched by the serving thread only.
  std::map<uint64_t, Conn> conns_;
  uint64_t next_conn_ = 1;
  StoreData data_;
  std::vector<Waiter> waiters_;

  std::atomic<int64_t> refused_{0};
  std::atomic<int> clients_{0};
  std::atomic<std::chrono::steady_clock::rep> last_request_{std::chrono::steady_clock::now().time_since_epoch().count()};
  mutable std::mutex refusals_mutex_;
  std::deque<std::string> refusals_;
};

}  // namespace sana::dist
