#include "sana/distributed/run_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/runtime.h"
#include "sana/distributed/watched_store.h"
#include "sana/torch_compat.h"
#include "sana/util/log.h"

namespace sana::dist {

RunStore::RunStore(std::shared_ptr<StoreServer> server, std::unique_ptr<StoreClient> client)
    : Store(client->timeout()), server_(std::move(server)), client_(std::move(client)) {}

void RunStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  client_->set(key, value);
}

std::vector<uint8_t> RunStore::compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                          const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->compare_set(key, current, value);
}

std::vector<uint8_t> RunStore::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->get(key, timeout_);
}

int64_t RunStore::add(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->add(key, value);
}

bool RunStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->erase(key);
}

bool RunStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->check(keys);
}

int64_t RunStore::getNumKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->num_keys();
}

int64_t RunStore::age_ms(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return client_->age_ms(key);
}

void RunStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RunStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  client_->wait(keys, timeout);
}

void RunStore::setTimeout(const std::chrono::milliseconds& timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  Store::setTimeout(timeout);
  client_->set_timeout(timeout);
}

namespace {

// torchrun's agent hosts the store: LibTorch's TCPStore client, bounded by the flight
// recorder's watchdog (its reads have no deadline of their own).
c10::intrusive_ptr<c10d::Store> open_agent_store(const RendezvousEndpoint& endpoint,
                                                 std::chrono::milliseconds timeout) {
  return c10::make_intrusive<c10d::TCPStore>(
      endpoint.host, compat::tcp_store_options(static_cast<uint16_t>(endpoint.port), false, timeout));
}

// Our own store (store_server.h): rank 0 serves it on the master address's interface.
c10::intrusive_ptr<c10d::Store> open_run_store(const RendezvousEndpoint& endpoint,
                                               std::chrono::milliseconds timeout, std::string* local_address) {
  std::shared_ptr<StoreServer> server;
  std::string host = endpoint.host;
  if (endpoint.server) {
    StoreServerOptions o;
    std::string note;
    o.bind_host = store_bind_host(endpoint.host, &note);
    if (!note.empty()) log::warn("{}", note);
    o.port = endpoint.port;
    o.token = endpoint.token;
    try {
      server = std::make_shared<StoreServer>(o);
    } catch (const std::exception& e) {
      throw DistTimeout(fmt::format(
          "rank 0 could not host the store: {}; another run may hold the port: set MASTER_PORT or "
          "dist.master_port",
          e.what()));
    }
    if (!o.bind_host.empty()) host = o.bind_host;
  }
  std::unique_ptr<StoreClient> client;
  try {
    client = std::make_unique<StoreClient>(host, endpoint.port, endpoint.token, timeout, timeout);
  } catch (const StoreRefused& e) {
    throw LaunchEnvError(fmt::format(
        "{}. Every rank of a run needs the same SANA_RUN_TOKEN (sana-train launch sets it; with mpirun "
        "pass it with -x SANA_RUN_TOKEN); or MASTER_ADDR/MASTER_PORT point at another run's store",
        e.what()));
  } catch (const std::exception& e) {
    throw DistTimeout(fmt::format(
        "could not reach the store of rank 0 at {}:{} within {} s ({}); check that rank 0 "
        "started, MASTER_ADDR/MASTER_PORT (or dist.master_addr/master_port) and the firewall",
        endpoint.host, endpoint.port, timeout.count() / 1000.0, e.what()));
  }
  if (local_address != nullptr) *local_address = client->local_address();
  return c10::make_intrusive<RunStore>(std::move(server), std::move(client));
}

}  // namespace

c10::intrusive_ptr<c10d::Store> open_store(const RendezvousEndpoint& endpoint,
                                           std::chrono::milliseconds timeout,
                                           std::chrono::milliseconds quick_limit, bool keep_in_record,
                                           std::string* local_address) {
  c10::intrusive_ptr<c10d::Store> store;
  {
    FlightOp record(OpFamily::store, endpoint.server ? "listen" : "connect",
                    fmt::format("{}:{}", endpoint.host, endpoint.port), 0,
                    timeout + WatchedStore::kWaitMargin, keep_in_record);
    if (!endpoint.key_prefix.empty()) {
      try {
        store = open_agent_store(endpoint, timeout);
      } catch (const std::exception& e) {
        record.failed(short_error(e));
        throw DistTimeout(fmt::format(
            "could not reach torchrun's store at {}:{} within {} s ({})", endpoint.host, endpoint.port,
            timeout.count() / 1000.0, short_error(e)));
      }
    } else {
      try {
        store = open_run_store(endpoint, timeout, local_address);
      } catch (const std::exception& e) {
        record.failed(e.what());
        throw;
      }
    }
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(store_key_prefix(endpoint), store);
  return c10::make_intrusive<WatchedStore>(prefixed, quick_limit, keep_in_record);
}

std::string store_key_prefix(const RendezvousEndpoint& endpoint) {
  return endpoint.key_prefix + kStorePrefix + endpoint.run_id + "/";
}

std::optional<int64_t> store_key_age_ms(c10d::Store& store, const RendezvousEndpoint& endpoint,
                                        const std::string& key) {
  // open_store's layers: the flight record's watch, the run's prefix, then our store.
  auto* watched = dynamic_cast<WatchedStore*>(&store);
  auto* prefixed = watched ? dynamic_cast<c10d::PrefixStore*>(watched->inner().get()) : nullptr;
  auto* ours = prefixed ? dynamic_cast<RunStore*>(prefixed->getUnderlyingStore().get()) : nullptr;
  if (ours == nullptr) return std::nullopt;
  return ours->age_ms(store_key_prefix(endpoint) + "/" + key);  // as c10d::PrefixStore joins them
}

}  // namespace sana::dist
