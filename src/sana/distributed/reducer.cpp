#include "sana/distributed/reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
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
  bool overflowed() const override { return overflowed_; }
  std::vector<int64_t> exact_scales() const override;
  void set_exact_scales(const std::vector<int64_t>& scales) override;

 private:
  // Exact mode: one bucket's integer accumulator (its elements, then two counters: ranks'
  // micro-batches that overflowed, and that were not finite) and scale exponent.
  struct Exact {
    torch::Tensor acc;
    int64_t scale = 32;
  };
  void absorb();          // the flat gradients into the accumulators; flats zeroed
  void finalize_exact();
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
  bool exact_ = false;
  std::vector<Exact> exact_state_;
  bool unabsorbed_ = false;  // a backward ran since the last absorb()
  bool overflowed_ = false;
  std::mutex mutex_;
  size_t next_launch_ = 0;
  bool syncing_ = false;
  std::set<std::string> warned_;  // parameters already named in the no-gradient warning
};

BucketedReducer::BucketedReducer(Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                 const ReducerOptions& opts)
    : rt_(rt), params_(std::move(params)), ready_(params_.size(), 0), target_(std::make_shared<HookTarget>()),
      overlap_(opts.overlap),
      average_(opts.average),
      exact_(opts.exact) {
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
  auto plan = compute_buckets_mb(infos, opts.bucket_cap_mb, opts.first_bucket_mb);
  bucket_of_ = bucket_of_params(plan, params_.size());
  for (auto& b : plan) {
    Bucket bucket;
    bucket.flat = torch::zeros({b.numel}, params_[b.params.front()].second.options());
    bucket.plan = std::move(b);
    buckets_.push_back(std::move(bucket));
  }
  if (exact_) {
    for (const auto& b : buckets_) exact_state_.push_back({torch::zeros({b.flat.numel() + 2}, torch::kInt64), 32});
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
  if (exact_) {
    if (unabsorbed_) absorb();
    unabsorbed_ = true;
    overflowed_ = false;
    syncing_ = false;
    return;
  }
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
  if (exact_) {
    finalize_exact();
    return;
  }
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

// A micro-batch's gradient times 2^scale must stay below 2^52, so that the sum of up to
// 1024 micro-batches (the trainer's limit in this mode) stays below 2^62.
constexpr double kExactLimit = 4503599627370496.0;  // 2^52
constexpr int64_t kExactTarget = 48;                // the summed peak's bits aimed at
constexpr int64_t kExactLowest = -120, kExactHighest = 120;  // 2^scale stays a finite float

void BucketedReducer::absorb() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    auto& flat = buckets_[i].flat;
    auto& e = exact_state_[i];
    const int64_t n = flat.numel();
    auto scaled = flat * std::ldexp(1.0, static_cast<int>(e.scale));  // exact: a power of two
    const float peak = scaled.abs().max().item<float>();
    if (!std::isfinite(peak)) {
      e.acc[n + 1] += 1;
    } else if (peak >= kExactLimit) {
      e.acc[n] += 1;
    } else {
      e.acc.narrow(0, 0, n).add_(scaled.round_().to(torch::kInt64));
    }
    flat.zero_();
  }
  unabsorbed_ = false;
}

void BucketedReducer::finalize_exact() {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  if (unabsorbed_) absorb();
  bool overflow = false, nonfinite = false;
  for (auto& e : exact_state_) {
    rt_.all_reduce(e.acc);  // integers: the same sum in any order
    const int64_t n = e.acc.numel() - 2;
    overflow = overflow || e.acc[n].item<int64_t>() > 0;
    nonfinite = nonfinite || e.acc[n + 1].item<int64_t>() > 0;
  }
  overflowed_ = overflow && !nonfinite;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    auto& e = exact_state_[i];
    auto& flat = buckets_[i].flat;
    const auto values = e.acc.narrow(0, 0, flat.numel());
    if (nonfinite) {
      flat.fill_(std::numeric_limits<float>::quiet_NaN());  // the trainer skips the step, as any non-finite one
    } else if (overflowed_) {
      // The caller runs the backward again; the buckets that overflowed with a smaller scale.
      if (e.acc[flat.numel()].item<int64_t>() > 0) e.scale = std::max(kExactLowest, e.scale - 12);
    } else {
      flat.copy_(values.to(torch::kFloat64).mul_(std::ldexp(1.0, static_cast<int>(-e.scale))));
      // The next step's scale from this sum's peak (the same on every rank).
      const auto peak = static_cast<uint64_t>(values.abs().max().item<int64_t>());
      if (peak > 0) {
        const int64_t bits = 64 - __builtin_clzll(peak);
        e.scale = std::clamp(e.scale + kExactTarget - bits, kExactLowest, kExactHighest);
      }
    }
    e.acc.zero_();
  }
}

std::vector<int64_t> BucketedReducer::exact_scales() const {
  std::vector<int64_t> out;
  for (const auto& e : exact_state_) out.push_back(e.scale);
  return out;
}

void BucketedReducer::set_exact_scales(const std::vector<int64_t>& scales) {
  if (scales.size() != exact_state_.size()) return;  // another bucket layout: start afresh
  for (size_t i = 0; i < scales.size(); ++i) exact_state_[i].scale = std::clamp(scales[i], kExactLowest, kExactHighest);
}

}  // namespace

PartState Reducer::save_state() const { return {{{"exact_scales", exact_scales()}}, std::nullopt}; }

void Reducer::restore_state(const PartState* saved, const std::string& /*source*/) {
  if (saved != nullptr && saved->json.contains("exact_scales")) {
    set_exact_scales(saved->json.at("exact_scales").get<std::vector<int64_t>>());
  }
}

std::unique_ptr<Reducer> make_reducer(Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                      ReducerOptions opts) {
  return std::make_unique<BucketedReducer>(rt, std::move(params), opts);
}

}  // namespace sana::dist
