#include "sana/distributed/reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <stdexcept>

#include "sana/distributed/bucket_assignment.h"
#include "sana/util/log.h"

namespace sana::dist {

namespace {

// What the hooks reach; cleared when the reducer goes, since the hooks stay on the
// parameters' accumulators as long as the parameters live.
struct HookTarget {
  std::mutex mutex;
  Reducer* reducer = nullptr;
};

struct ReadyHook : public torch::autograd::FunctionPostHook {
  ReadyHook(std::shared_ptr<HookTarget> target, size_t index) : target_(std::move(target)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    std::lock_guard<std::mutex> lock(target_->mutex);
    if (target_->reducer) target_->reducer->add_gradient(index_);
    return outputs;
  }
  std::shared_ptr<HookTarget> target_;
  size_t index_;
};

// The overlapped engine: executes compute_buckets()'s assignment with one flat tensor and
// one asynchronous all-reduce per bucket.
class BucketedReducer : public Reducer {
 public:
  BucketedReducer(Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params, const ReducerOptions& opts);
  ~BucketedReducer() override;
  BucketedReducer(const BucketedReducer&) = delete;
  BucketedReducer& operator=(const BucketedReducer&) = delete;

  void begin_backward(bool sync) override;
  void add_gradient(size_t param) override;
  void finalize() override;
  size_t bucket_count() const override { return buckets_.size(); }
  std::vector<torch::Tensor> flat_gradients() const override;
  void zero_gradients() override;
  std::vector<FlatBucket> flatten_parameters() override;

 private:
  struct Bucket {
    GradBucket plan;
    size_t pending = 0;
    torch::Tensor flat;
    PendingCollective work;
  };
  void launch_ready_in_order();  // mutex_ held
  void bind_gradients();         // mutex_ held

  Runtime& rt_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<torch::Tensor> grad_views_;  // per parameter: its shape over its bucket's slice
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooks alive
  std::vector<char> ready_;
  std::shared_ptr<HookTarget> target_;
  bool overlap_ = true;
  bool average_ = true;
  std::mutex mutex_;
  size_t next_launch_ = 0;
  bool syncing_ = false;
  std::set<std::string> warned_;  // parameters already named in the no-gradient warning
};

BucketedReducer::BucketedReducer(Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                 const ReducerOptions& opts)
    : rt_(rt), params_(std::move(params)), ready_(params_.size(), 0), target_(std::make_shared<HookTarget>()),
      overlap_(opts.overlap),
      average_(opts.average) {
  std::vector<ParamInfo> infos;
  infos.reserve(params_.size());
  for (const auto& [name, p] : params_) {
    if (!p.requires_grad() || !p.is_leaf()) {
      throw std::invalid_argument(fmt::format(
          "gradient reducer: parameter '{}' is {}; pass only trainable parameters", name,
          p.requires_grad() ? "not a leaf tensor" : "frozen (requires_grad false)"));
    }
    infos.push_back({name, p.numel(), static_cast<int64_t>(p.element_size()), static_cast<int>(p.scalar_type())});
  }
  const auto cap_bytes = [](double mb) { return static_cast<int64_t>(mb * 1024 * 1024); };
  auto plan = compute_buckets(infos, cap_bytes(opts.bucket_cap_mb), cap_bytes(opts.first_bucket_mb));
  bucket_of_ = bucket_of_params(plan, params_.size());
  for (auto& b : plan) {
    Bucket bucket;
    bucket.flat = torch::zeros({b.numel}, params_[b.params.front()].second.options());
    bucket.plan = std::move(b);
    buckets_.push_back(std::move(bucket));
  }
  grad_views_.resize(params_.size());
  for (const auto& b : buckets_) {
    for (size_t i = 0; i < b.plan.params.size(); ++i) {
      const auto& p = params_[b.plan.params[i]].second;
      grad_views_[b.plan.params[i]] = b.flat.narrow(0, b.plan.offsets[i], p.numel()).view(p.sizes());
    }
  }
  bind_gradients();
  target_->reducer = this;
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k].second);
    acc->add_post_hook(std::make_unique<ReadyHook>(target_, k));
    accumulators_.push_back(std::move(acc));
  }
}

BucketedReducer::~BucketedReducer() {
  {
    std::lock_guard<std::mutex> lock(target_->mutex);
    target_->reducer = nullptr;  // a backward after this one reaches no dangling object
  }
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work.work()->wait();
      } catch (...) {
      }
      b.work.reset();
    }
  }
}

void BucketedReducer::bind_gradients() {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    auto& p = params_[k].second;
    const auto& view = grad_views_[k];
    if (p.grad().defined() && p.grad().data_ptr() == view.data_ptr()) continue;
    if (p.grad().defined()) {
      view.copy_(p.grad());
    } else {
      view.zero_();
    }
    p.mutable_grad() = view;
  }
}

std::vector<torch::Tensor> BucketedReducer::flat_gradients() const {
  std::vector<torch::Tensor> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.flat);
  return out;
}

void BucketedReducer::zero_gradients() {
  std::lock_guard<std::mutex> lock(mutex_);
  bind_gradients();
  for (auto& b : buckets_) b.flat.zero_();
}

std::vector<FlatBucket> BucketedReducer::flatten_parameters() {
  torch::NoGradGuard no_grad;
  std::vector<FlatBucket> out;
  for (const auto& b : buckets_) {
    auto flat = torch::zeros_like(b.flat);  // alignment gaps stay zero
    for (size_t i = 0; i < b.plan.params.size(); ++i) {
      auto& p = params_[b.plan.params[i]].second;
      auto view = flat.narrow(0, b.plan.offsets[i], p.numel()).view(p.sizes());
      view.copy_(p);
      p.set_data(view);
    }
    out.push_back({flat, b.flat, b.plan});
  }
  return out;
}

void BucketedReducer::begin_backward(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  bind_gradients();
  syncing_ = sync;
  if (!sync) return;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = b.plan.params.size();
    b.work.reset();
  }
  next_launch_ = 0;
}

void BucketedReducer::add_gradient(size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!syncing_ || ready_[k]) return;
  ready_[k] = 1;
  auto& b = buckets_[bucket_of_[k]];
  --b.pending;
  if (b.pending == 0 && overlap_) launch_ready_in_order();
}

void BucketedReducer::launch_ready_in_order() {
  // The gradients are views into the flat tensor: it is the bucket's gradient already.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    buckets_[next_launch_].work = rt_.all_reduce_async(buckets_[next_launch_].flat);
    ++next_launch_;
  }
}

void BucketedReducer::finalize() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Parameters without a gradient this backward keep what earlier micro-steps gave them
    // (zero if nothing), so every rank still issues every bucket in the same order (like
    // find_unused_parameters).
    std::vector<std::string> missing;
    for (size_t k = 0; k < params_.size(); ++k) {
      if (ready_[k]) continue;
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
    if (world != 1.0 && average_) b.flat.div_(world);
  }
}

}  // namespace

std::unique_ptr<Reducer> make_reducer(Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                      ReducerOptions opts) {
  return std::make_unique<BucketedReducer>(rt, std::move(params), opts);
}

}  // namespace sana::dist
