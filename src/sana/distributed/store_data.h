// The keys and values of the run's store and what each request does to them, with
// c10d's semantics (counters kept as decimal text; compare-set creates a missing key only
// when `expected` is empty). No sockets: store_server.h feeds it whole request bodies,
// which may come from anyone that passed the hello, so every field is bounds-checked.
// Never includes torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sana/distributed/store_protocol.h"

namespace sana::dist {

class StoreData {
 public:
  struct Outcome {
    enum class Kind { reply, park, malformed } kind = Kind::malformed;
    store_wire::Bytes frame;        // reply: the reply frame
    bool changed = false;           // reply: a key was created or changed (wake the waiters)
    store_wire::Op op{};            // park: get or wait
    std::vector<std::string> keys;  // park: the keys waited for
    int64_t timeout_ms = 0;         // park: how long
  };

  // `now_ms`: the host's clock, in milliseconds, for `age` (a steady clock by default).
  explicit StoreData(std::function<int64_t()> now_ms = steady_ms);
  static int64_t steady_ms();

  // Applies one request body (op byte and fields) from a connection past its hello.
  Outcome apply(const uint8_t* body, size_t size);
  bool has_all(const std::vector<std::string>& keys) const;
  // The reply to a parked get or wait whose keys now all exist.
  store_wire::Bytes answer(store_wire::Op op, const std::vector<std::string>& keys) const;
  size_t size() const { return data_.size(); }

 private:
  Outcome wait_or_get(store_wire::Op op, store_wire::FrameReader& r);
  Outcome add(store_wire::FrameReader& r);
  Outcome compare_set(store_wire::FrameReader& r);
  // Stores `value` under `key` and notes when.
  void write(const std::string& key, store_wire::Bytes value);

  std::function<int64_t()> now_ms_;
  std::unordered_map<std::string, store_wire::Bytes> data_;
  std::unordered_map<std::string, int64_t> written_ms_;  // when each key was last written
};

}  // namespace sana::dist
