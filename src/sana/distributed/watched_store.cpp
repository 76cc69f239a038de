#include "sana/distributed/watched_store.h"

#include <fmt/format.h>

#include "sana/distributed/flight_recorder.h"

namespace sana::dist {

namespace {

// A waiting operation's limit: its timeout plus the margin; none when it waits forever.
std::chrono::milliseconds wait_limit(std::chrono::milliseconds timeout) {
  return timeout.count() <= 0 ? std::chrono::milliseconds(0) : timeout + WatchedStore::kWaitMargin;
}

std::string key_list(const std::vector<std::string>& keys) {
  return keys.size() == 1 ? keys.front() : fmt::format("{} (+{} more)", keys.front(), keys.size() - 1);
}

}  // namespace

WatchedStore::WatchedStore(c10::intrusive_ptr<c10d::Store> inner,
                           std::chrono::milliseconds quick_limit, bool keep)
    : Store(inner->getTimeout()), inner_(std::move(inner)), quick_limit_(quick_limit), keep_(keep) {}

template <class Op>
auto WatchedStore::run(const char* kind, const std::string& what, int64_t bytes,
                       std::chrono::milliseconds limit, Op&& op) -> decltype(op()) {
  FlightOp record(OpFamily::store, kind, what, bytes, limit, keep_);
  try {
    return op();
  } catch (const std::exception& e) {
    record.failed(e.what());
    throw;
  }
}

void WatchedStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  run("set", key, static_cast<int64_t>(value.size()), quick_limit_, [&] { inner_->set(key, value); });
}

std::vector<uint8_t> WatchedStore::compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                              const std::vector<uint8_t>& value) {
  return run("compare-set", key, static_cast<int64_t>(value.size()), quick_limit_,
             [&] { return inner_->compareSet(key, current, value); });
}

std::vector<uint8_t> WatchedStore::get(const std::string& key) {
  // A get waits for the key up to the store's timeout first.
  return run("get", key, 0, wait_limit(inner_->getTimeout()), [&] { return inner_->get(key); });
}

int64_t WatchedStore::add(const std::string& key, int64_t value) {
  return run("add", key, 8, quick_limit_, [&] { return inner_->add(key, value); });
}

bool WatchedStore::deleteKey(const std::string& key) {
  return run("delete", key, 0, quick_limit_, [&] { return inner_->deleteKey(key); });
}

bool WatchedStore::check(const std::vector<std::string>& keys) {
  return run("check", keys.empty() ? "" : key_list(keys), 0, quick_limit_,
             [&] { return inner_->check(keys); });
}

int64_t WatchedStore::getNumKeys() {
  return run("count-keys", "", 0, quick_limit_, [&] { return inner_->getNumKeys(); });
}

void WatchedStore::wait(const std::vector<std::string>& keys) { wait(keys, inner_->getTimeout()); }

void WatchedStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  run("wait", keys.empty() ? "" : key_list(keys), 0, wait_limit(timeout),
      [&] { inner_->wait(keys, timeout); });
}

const std::chrono::milliseconds& WatchedStore::getTimeout() const noexcept { return inner_->getTimeout(); }

void WatchedStore::setTimeout(const std::chrono::milliseconds& timeout) {
  Store::setTimeout(timeout);
  inner_->setTimeout(timeout);
}

}  // namespace sana::dist
