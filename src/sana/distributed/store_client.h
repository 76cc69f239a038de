// A client of the run's store (store_server.h). Every call has a deadline: a store host
// that stops answering, halfway through a reply or not at all, makes the call throw
// StoreTimeout instead of blocking. Once a call fails for want of an answer the
// connection is closed and every later call fails at once (the store's state is then
// unknown; the caller reports the store host as lost). Plain POSIX; never includes torch.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/distributed/store_protocol.h"

namespace sana::dist {

// The store host did not answer in time, or a key did not appear within a wait's timeout.
class StoreTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The connection could not be made or was lost.
class StoreLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store refused this process: another run's store, or a different token.
class StoreRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StoreClient {
 public:
  using Bytes = store_wire::Bytes;
  using ms = std::chrono::milliseconds;

  // Connects within `connect_timeout` (a refused connection is retried until then: the
  // store host may not be up yet) and says hello with `token`. `timeout` bounds every
  // later call; waits get it plus kAnswerMargin for the answer.
  StoreClient(std::string host, int port, std::string token, ms connect_timeout, ms timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  static constexpr ms kAnswerMargin{2000};

  void set(const std::string& key, const Bytes& value);
  // Waits up to `wait` for the key to exist.
  Bytes get(const std::string& key, ms wait);
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired);
  bool erase(const std::string& key);
  int64_t num_keys();
  // Milliseconds since the store host last saw `key` written (by anyone); -1: no such key.
  int64_t age_ms(const std::string& key);
  // Waits up to `wait` for every key to exist; StoreTimeout names the missing ones.
  void wait(const std::vector<std::string>& keys, ms wait);

  ms timeout() const { return timeout_; }
  void set_timeout(ms timeout) { timeout_ = timeout; }
  // This host's end of the connection ("198.18.0.2"): the address that reaches the store
  // host, for listening sockets that must be reachable from there.
  const std::string& local_address() const { return local_address_; }
  // "host:port" of the store.
  std::string where() const;

 private:
  // Sends one request and reads its reply within `limit`; returns the reply body after
  // the status byte's check (StoreTimeout for Status::timeout, runtime_error for error).
  Bytes call(store_wire::Bytes frame, const char* what, const std::string& key, ms limit);
  void send_all(const store_wire::Bytes& frame, std::chrono::steady_clock::time_point deadline,
                const char* what, const std::string& key);
  void recv_exact(uint8_t* p, size_t n, std::chrono::steady_clock::time_point deadline, const char* what,
                  const std::string& key);
  // The connection is closed for good; every later call fails at once with `why`.
  [[noreturn]] void lose(const std::string& why);
  [[noreturn]] void time_out(const std::string& why);

  std::string host_;
  int port_;
  ms timeout_;
  ms call_limit_{0};  // the limit of the call in progress, for messages
  int fd_ = -1;
  std::string lost_;  // why the connection is gone ("" while it works)
  std::string local_address_;
};

}  // namespace sana::dist
