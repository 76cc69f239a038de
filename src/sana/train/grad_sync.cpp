#include "sana/train/grad_sync.h"

#include <fmt/format.h>

#include "sana/util/log.h"

namespace sana::train {

struct ReadyHook : public torch::autograd::FunctionPostHook {
  ReadyHook(std::shared_ptr<GradSync::Target> target, size_t index) : target_(std::move(target)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    std::lock_guard<std::mutex> lock(target_->mutex);
    if (target_->sync) target_->sync->mark_ready(index_);
    return outputs;
  }
  std::shared_ptr<GradSync::Target> target_;
  size_t index_;
};

GradSync::GradSync(dist::Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                   double bucket_cap_mb, double first_bucket_mb, bool overlap)
    : rt_(rt),
      params_(std::move(params)),
      bucket_of_(params_.size()),
      ready_(params_.size(), 0),
      target_(std::make_shared<Target>()),
      overlap_(overlap) {
  target_->sync = this;
  const auto cap_bytes = [](double mb) { return static_cast<int64_t>(mb * 1024 * 1024); };
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k].second;
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t cap = cap_bytes(buckets_.size() <= 1 ? first_bucket_mb : bucket_cap_mb);
    const bool new_bucket = buckets_.empty() ||
                            (buckets_.back().numel * static_cast<int64_t>(p.element_size()) + bytes > cap &&
                             !buckets_.back().params.empty()) ||
                            buckets_.back().flat.scalar_type() != p.scalar_type();
    if (new_bucket) {
      buckets_.emplace_back();
      buckets_.back().flat = torch::empty({0}, p.options());
    }
    auto& b = buckets_.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& b : buckets_) b.flat = torch::zeros({b.numel}, b.flat.options());
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k].second);
    acc->add_post_hook(std::make_unique<ReadyHook>(target_, k));
    accumulators_.push_back(std::move(acc));
  }
}

GradSync::~GradSync() {
  {
    std::lock_guard<std::mutex> lock(target_->mutex);
    target_->sync = nullptr;  // a backward after this one reaches no dangling object
  }
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  }
}

std::vector<std::vector<std::string>> GradSync::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(params_[k].first);
  }
  return out;
}

void GradSync::begin_backward(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  syncing_ = sync;
  if (!sync) return;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.work.reset();
  }
  next_launch_ = 0;
}

void GradSync::mark_ready(size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!syncing_ || ready_[k]) return;
  ready_[k] = 1;
  auto& b = buckets_[bucket_of_[k]];
  --b.pending;
  if (b.pending == 0 && overlap_) launch_ready_in_order();
}

void GradSync::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_]);
    ++next_launch_;
  }
}

void GradSync::launch(Bucket& b) {
  for (size_t i = 0; i < b.params.size(); ++i) {
    const auto& p = params_[b.params[i]].second;
    auto slice = b.flat.narrow(0, b.offsets[i], p.numel());
    if (p.grad().defined()) {
      slice.copy_(p.grad().reshape({-1}));
    } else {
      slice.zero_();
    }
  }
  b.launched = true;
  b.work = rt_.all_reduce_async(b.flat);
}

void GradSync::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Parameters without a gradient this step: zero gradients, so every rank still issues
    // every bucket in the same order (like find_unused_parameters).
    std::vector<std::string> missing;
    for (size_t k = 0; k < params_.size(); ++k) {
      if (ready_[k]) continue;
      auto& p = params_[k].second;
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      if (warned_.insert(params_[k].first).second) missing.push_back(params_[k].first);
      ready_[k] = 1;
      --buckets_[bucket_of_[k]].pending;
    }
    if (!missing.empty()) {
      log::warn("{} parameter{} got no gradient (zero-filled, reported once): {}{}", missing.size(),
                missing.size() == 1 ? "" : "s",
                fmt::join(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(missing.size(), 8)), ", "),
                missing.size() > 8 ? ", ..." : "");
    }
    launch_ready_in_order();
    syncing_ = false;
  }
  const double world = static_cast<double>(rt_.world_size());
  for (auto& b : buckets_) {
    rt_.wait(b.work, "gradient all-reduce");
    b.work.reset();
    b.flat.div_(world);
    for (size_t i = 0; i < b.params.size(); ++i) {
      auto& p = params_[b.params[i]].second;
      p.mutable_grad().view({-1}).copy_(b.flat.narrow(0, b.offsets[i], p.numel()));
    }
  }
}

}  // namespace sana::train
