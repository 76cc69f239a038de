#include "sana/parallel/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "sana/parallel/bucket_assignment.h"
#include "sana/parallel/bucketed_reducer.h"
#include "sana/util/log.h"

namespace sana::parallel {

namespace detail {

BucketedReducer::BucketedReducer(dist::Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                 const ReducerOptions& opts)
    : rt_(rt), params_(std::move(params)), ready_(params_.size(), 0),
      overlap_(opts.overlap),
      average_(opts.average),
      exact_(opts.exact),
      shard_(!opts.exact && ((opts.shard_gradients && rt.world_size() > 1) || opts.gradients_on_host)),
      on_host_(shard_ && opts.gradients_on_host),
      reduce_to_owners_(shard_ && rt.world_size() > 1 && rt.backend_name() == "nccl") {
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
  std::vector<int64_t> numels;
  for (const auto& info : infos) numels.push_back(info.numel);
  plan_ = plan_shards(plan, params_.size(), numels, rt.world_size());
  for (auto& b : plan) {
    Bucket bucket;
    bucket.plan = std::move(b);
    buckets_.push_back(std::move(bucket));
  }
  if (exact_) {
    for (const auto& b : buckets_) exact_state_.push_back({torch::zeros({b.plan.numel + 2}, torch::kInt64), 32});
  }
  grad_views_.resize(params_.size());
  owned_views_.resize(params_.size());
  if (shard_) {
    // This rank's segments end to end, each parameter's gradient a view of them.
    int64_t at = 0;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      owned_at_.emplace_back();
      for (const auto& seg : plan_.segments[i]) {
        owned_at_.back().push_back(seg.owner == rt.rank() ? at : -1);
        if (seg.owner == rt.rank()) at += seg.numel();
      }
    }
    auto kept = params_.front().second.options().device(rt.device());
    if (on_host_) {  // page-locked on a GPU: the copies out of the buckets run at full speed
      const bool pin = kept.device().is_cuda();
      kept = kept.device(torch::kCPU).pinned_memory(pin);
    }
    owned_ = torch::zeros({at}, kept);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const auto& b = buckets_[i].plan;
      for (size_t s = 0; s < plan_.segments[i].size(); ++s) {
        const auto& seg = plan_.segments[i][s];
        if (owned_at_[i][s] < 0) continue;
        for (size_t j = seg.first; j < seg.first + seg.count; ++j) {
          const auto& p = params_[b.params[j]].second;
          owned_views_[b.params[j]] = owned_.narrow(0, owned_at_[i][s] + b.offsets[j] - seg.begin, p.numel()).view(p.sizes());
        }
      }
    }
    for (auto& b : buckets_) b.harvested = true;  // released: allocated when the first gradient comes
  } else {
    for (size_t i = 0; i < buckets_.size(); ++i) allocate(i);
    bind_gradients();
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params_) tensors.push_back(p);
  hooks_.emplace(tensors, [this](size_t k) { add_gradient(k); });
}

BucketedReducer::~BucketedReducer() {
  hooks_.reset();  // a backward after this one reaches no dangling object
  for (auto& b : buckets_) {
    for (auto& w : b.works) {
      if (!w) continue;
      try {
        w.work()->wait();
      } catch (...) {
      }
      w.reset();
    }
  }
}

void BucketedReducer::allocate(size_t i) {
  auto& b = buckets_[i];
  // On the run's device, wherever the parameters are between steps (a swapped block's are
  // in host memory: their gradients still come on the device).
  b.flat = torch::zeros({b.plan.numel}, params_[b.plan.params.front()].second.options().device(rt_.device()));
  b.harvested = false;
  for (size_t j = 0; j < b.plan.params.size(); ++j) {
    const auto& p = params_[b.plan.params[j]].second;
    grad_views_[b.plan.params[j]] = b.flat.narrow(0, b.plan.offsets[j], p.numel()).view(p.sizes());
  }
}

void BucketedReducer::bind_lazily(size_t k) {
  torch::NoGradGuard no_grad;
  const size_t i = bucket_of_[k];
  if (!buckets_[i].flat.defined()) allocate(i);
  auto& p = params_[k].second;
  const auto& view = grad_views_[k];
  if (!p.grad().defined() || p.grad().data_ptr() == view.data_ptr()) return;
  view.copy_(p.grad());  // autograd made a new tensor: from now on it accumulates into the bucket
  p.mutable_grad() = view;
}

void BucketedReducer::harvest(size_t i) {
  auto& b = buckets_[i];
  if (b.harvested) return;
  for (auto& w : b.works) rt_.wait(w, "gradient reduce");
  b.works.clear();
  torch::NoGradGuard no_grad;
  const double world = static_cast<double>(rt_.world_size());
  for (size_t s = 0; s < plan_.segments[i].size(); ++s) {
    if (owned_at_[i][s] < 0) continue;
    const auto& seg = plan_.segments[i][s];
    auto mine = owned_.narrow(0, owned_at_[i][s], seg.numel());
    mine.copy_(b.flat.narrow(0, seg.begin, seg.numel()));
    if (average_) mine.div_(world);
  }
  for (size_t k : b.plan.params) {
    params_[k].second.mutable_grad() = owned_views_[k];  // undefined where another rank owns it
    grad_views_[k] = torch::Tensor();
  }
  b.flat = torch::Tensor();
  b.harvested = true;
}

void BucketedReducer::harvest_completed() {
  while (next_harvest_ < next_launch_) {
    for (const auto& w : buckets_[next_harvest_].works) {
      if (w && !w.work()->isCompleted()) return;
    }
    harvest(next_harvest_++);
  }
}

torch::Tensor BucketedReducer::segment_gradient(size_t bucket, size_t segment) const {
  const auto& seg = plan_.segments.at(bucket).at(segment);
  if (shard_) return owned_.narrow(0, owned_at_.at(bucket).at(segment), seg.numel());
  return buckets_.at(bucket).flat.narrow(0, seg.begin, seg.numel());
}

void BucketedReducer::bind_gradients() {
  if (shard_) return;  // bound one by one as the gradients come (bind_lazily)
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
  if (shard_) {  // per bucket, its owned segments: contiguous in owned_ (shard_plan.h)
    for (size_t i = 0; i < buckets_.size(); ++i) {
      int64_t begin = -1, numel = 0;
      for (size_t s = 0; s < plan_.segments[i].size(); ++s) {
        if (owned_at_[i][s] < 0) continue;
        if (begin < 0) begin = owned_at_[i][s];
        numel += plan_.segments[i][s].numel();
      }
      if (begin >= 0) out.push_back(owned_.narrow(0, begin, numel));
    }
    return out;
  }
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.flat);
  return out;
}

void BucketedReducer::zero_gradients() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shard_) {
    // The optimizer has used them: autograd makes new ones at the next backward.
    for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
    owned_.zero_();
    return;
  }
  bind_gradients();
  for (auto& b : buckets_) b.flat.zero_();
}

void BucketedReducer::regroup() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shard_ || exact_) throw std::logic_error("regroup: whole, non-exact gradients only");
  for (auto& b : buckets_) {
    for (auto& w : b.works) w.reset("abandoned: a rank was lost");
    b.works.clear();
  }
  for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
  for (size_t i = 0; i < buckets_.size(); ++i) allocate(i);
  std::vector<GradBucket> plan;
  std::vector<int64_t> numels;
  for (const auto& b : buckets_) plan.push_back(b.plan);
  for (const auto& [name, p] : params_) numels.push_back(p.numel());
  plan_ = plan_shards(plan, params_.size(), numels, rt_.world_size());  // who writes which checkpoint entries
  bind_gradients();
  syncing_ = false;
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  next_harvest_ = 0;
}

void BucketedReducer::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& b : buckets_) {
    for (auto& w : b.works) w.reset("abandoned: a rank was lost");
    b.works.clear();
  }
}

std::vector<FlatBucket> BucketedReducer::flatten_parameters() {
  torch::NoGradGuard no_grad;
  std::vector<FlatBucket> out;
  for (const auto& b : buckets_) {
    // Where its parameters are: a block swapped to the host (model/swapped_blocks.h) owns
    // whole buckets, kept there page-locked on a GPU (they are copied to the device ahead of
    // each use). Alignment gaps stay zero.
    const auto& front = params_[b.plan.params.front()];
    auto options = front.second.options();
    if (front.second.is_cpu() && rt_.device().is_cuda()) options = options.pinned_memory(true);
    auto flat = torch::zeros({b.plan.numel}, options);
    for (size_t i = 0; i < b.plan.params.size(); ++i) {
      auto& p = params_[b.plan.params[i]].second;
      if (p.device() != front.second.device()) {
        throw std::logic_error(fmt::format("flatten_parameters: bucket {} holds '{}' on {} and '{}' on {}", out.size(),
                                           front.first, front.second.device().str(), params_[b.plan.params[i]].first,
                                           p.device().str()));
      }
      auto view = flat.narrow(0, b.plan.offsets[i], p.numel()).view(p.sizes());
      view.copy_(p);
      p.set_data(view);
    }
    out.push_back({flat, b.flat, b.plan});  // grads undefined with sharded gradients: see segment_gradient()
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
    b.works.clear();
  }
  next_launch_ = 0;
  next_harvest_ = 0;
}

void BucketedReducer::add_gradient(size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shard_) bind_lazily(k);  // every backward, accumulating ones too
  if (!syncing_ || ready_[k]) return;
  ready_[k] = 1;
  auto& b = buckets_[bucket_of_[k]];
  --b.pending;
  if (b.pending == 0 && overlap_) launch_ready_in_order();
}

void BucketedReducer::launch(size_t i) {
  auto& b = buckets_[i];
  if (!b.flat.defined()) allocate(i);  // sharded: no parameter of it got a gradient; zeros, still sent
  if (!reduce_to_owners_) {
    b.works.push_back(rt_.all_reduce_async(b.flat));
    return;
  }
  for (const auto& seg : plan_.segments[i]) {
    auto part = b.flat.narrow(0, seg.begin, seg.numel());
    b.works.push_back(rt_.reduce_async(part, seg.owner));
  }
}

void BucketedReducer::launch_ready_in_order() {
  // The gradients are views into the flat tensor: it is the bucket's gradient already.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
  if (shard_) harvest_completed();  // the memory of buckets already reduced goes now, mid-backward
}

void BucketedReducer::reduce() {
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
  if (shard_) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < buckets_.size(); ++i) harvest(i);
    return;
  }
  const double world = static_cast<double>(rt_.world_size());
  for (auto& b : buckets_) {
    for (auto& w : b.works) rt_.wait(w, "gradient all-reduce");
    b.works.clear();
    if (world != 1.0 && average_) b.flat.div_(world);
  }
}

}  // namespace detail

PartState Reducer::save_state() const { return {{{"exact_scales", exact_scales()}}, std::nullopt, {}}; }

void Reducer::restore_state(const PartState* saved, const std::string& /*source*/) {
  if (saved != nullptr && saved->json.contains("exact_scales")) {
    set_exact_scales(saved->json.at("exact_scales").get<std::vector<int64_t>>());
  }
}

std::unique_ptr<Reducer> make_reducer(dist::Runtime& rt, std::vector<std::pair<std::string, torch::Tensor>> params,
                                      ReducerOptions opts) {
  return std::make_unique<detail::BucketedReducer>(rt, std::move(params), opts);
}

}  // namespace sana::parallel
