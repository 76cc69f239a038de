#include "sana/distributed/background_gather.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <thread>

#include "sana/distributed/failure_watch.h"
#include "sana/distributed/runtime.h"

namespace sana::dist {

BackgroundGather::BackgroundGather(const RendezvousEndpoint& endpoint, int rank, int world_size,
                                   std::chrono::milliseconds timeout, std::vector<int> members)
    : endpoint_(endpoint), rank_(rank), world_(world_size), timeout_(timeout), members_(std::move(members)) {
  endpoint_.server = false;
  if (members_.empty()) {
    for (int r = 0; r < world_; ++r) members_.push_back(r);
  }
}

std::vector<std::string> BackgroundGather::gather(const std::string& name, const std::string& mine) {
  if (world_ == 1) return {mine};
  if (!store_) store_ = open_store(endpoint_, timeout_, timeout_);
  const auto key = [&](int r) { return fmt::format("bg/{}/{}", name, r); };
  store_->set(key(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  if (rank_ != 0) return {};
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::vector<std::string> out(static_cast<size_t>(world_));
  out[0] = mine;
  std::vector<int> missing;
  for (int r = 1; r < world_; ++r) missing.push_back(r);
  while (!missing.empty()) {
    std::vector<int> still;
    for (int r : missing) {
      if (!store_->check({key(r)})) {
        still.push_back(r);
        continue;
      }
      const auto bytes = store_->get(key(r));
      out[static_cast<size_t>(r)].assign(bytes.begin(), bytes.end());
      store_->deleteKey(key(r));
    }
    missing = std::move(still);
    if (missing.empty()) break;
    const std::string failure = published_failure(*store_);
    if (!failure.empty()) throw PeerFailure(failure);
    for (int r : missing) {
      const std::string lost = keys::lost(members_.at(static_cast<size_t>(r)));
      if (store_->check({lost})) {
        const auto why = store_->get(lost);
        throw PeerFailure(fmt::format("{}: rank {} was lost ({})", name, r, std::string(why.begin(), why.end())));
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw DistTimeout(fmt::format("{}: rank{} {} did not report within {} s (dist.timeout_s)", name,
                                    missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                                    timeout_.count() / 1000.0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a store has no wait for any of several keys
  }
  store_->deleteKey(key(0));
  return out;
}

}  // namespace sana::dist
