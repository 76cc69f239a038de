// The run's store as a c10d::Store (what Gloo and NCCL take): a StoreClient connection,
// and on the store host the StoreServer too, kept alive as long as this object. Every
// call is bounded by the client's deadlines (store_client.h).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sana/distributed/store_client.h"
#include "sana/distributed/store_server.h"

namespace sana::dist {

class RunStore : public c10d::Store {
 public:
  // `server`: null on every process but the store host.
  RunStore(std::shared_ptr<StoreServer> server, std::unique_ptr<StoreClient> client);

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
  void setTimeout(const std::chrono::milliseconds& timeout) override;
  // c10d's "thread-safe copy on the same store": this object, whose calls already take turns
  // on the one connection. Pure virtual in newer LibTorch (2.11), absent in 1.13 and 2.6: no
  // `override`, so it overrides where the base has it and is a plain member where not.
  c10::intrusive_ptr<c10d::Store> clone() { return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this); }

  // This host's address as the store host sees it (store_client.h).
  const std::string& local_address() const { return client_->local_address(); }
  // Milliseconds since the store host last saw `key` (the whole key) written; -1: none.
  int64_t age_ms(const std::string& key);
  const StoreServer* server() const { return server_.get(); }

 private:
  std::mutex mutex_;  // one request at a time on the connection
  std::shared_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace sana::dist
