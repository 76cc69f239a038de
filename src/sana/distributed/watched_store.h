// A c10d::Store that records every operation in the process's flight record with a
// deadline: quick operations (set, check, add, ...) get `quick_limit`, waiting ones (get,
// wait) the wait's own timeout plus a margin. When a store host stops answering (rank 0
// stopped, hung or cut off), the flight recorder's watchdog finds the overdue operation
// even though the calling thread is blocked in a socket read with no timeout of its own.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace sana::dist {

class WatchedStore : public c10d::Store {
 public:
  // keep: whether finished operations stay in the flight record (false for the failure
  // watch's beats, which would push everything else out).
  WatchedStore(c10::intrusive_ptr<c10d::Store> inner, std::chrono::milliseconds quick_limit,
               bool keep = true);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  const std::chrono::milliseconds& getTimeout() const noexcept override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;
  // c10d's "thread-safe copy on the same store": the same watch around the inner store (whose
  // own copy, where c10d has one, is the inner store's business). No `override`: see
  // RunStore::clone.
  c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<WatchedStore>(inner_, quick_limit_, keep_);
  }

  // The store it watches.
  const c10::intrusive_ptr<c10d::Store>& inner() const { return inner_; }

  // The margin a waiting operation gets beyond its own timeout before it is overdue.
  static constexpr std::chrono::milliseconds kWaitMargin{5000};

 private:
  template <class Op>
  auto run(const char* kind, const std::string& what, int64_t bytes, std::chrono::milliseconds limit,
           Op&& op) -> decltype(op());

  c10::intrusive_ptr<c10d::Store> inner_;
  std::chrono::milliseconds quick_limit_;
  bool keep_;
};

}  // namespace sana::dist
