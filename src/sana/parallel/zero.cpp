#include "sana/parallel/zero.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>

#include "sana/distributed/tensor_stream.h"

namespace sana::parallel {

Zero::Zero(int stage, dist::Runtime& rt, const NamedParams& params, parallel::Reducer& reducer, model::SanaMSImpl& model,
           at::ScalarType gather_dtype)
    : stage_(stage), rt_(rt), reducer_(reducer), flat_(reducer.flatten_parameters()), model_(model) {
  const auto& plan = reducer.shard_plan();
  owned_index_.assign(params.size(), -1);
  for (size_t k = 0; k < params.size(); ++k) {
    index_[params[k].first] = k;
    shapes_.emplace_back(params[k].first, params[k].second.sizes().vec());
    if (shards_state() && plan.owner.at(k) != rt.rank()) continue;
    owned_index_[k] = static_cast<int>(owned_.size());
    owned_.push_back(params[k]);
  }
  if (stage_ >= 3 && shards_state()) {
    gathered_ = std::make_unique<GatheredParameters>(rt, plan, flat_, params, gather_dtype);
    model_.add_block_hooks(gathered_.get());
    // What a step's backward still holds goes once its gradients are reduced.
    reducer_.after_finalize([g = gathered_.get()] { g->step_done(); });
  }
}

Zero::~Zero() {
  if (gathered_) {
    model_.remove_block_hooks(gathered_.get());
    reducer_.after_finalize({});
  }
}

std::function<void()> Zero::after_update() {
  if (!shards_state() || gathered_) return {};  // stage 3 gathers when the forward needs them
  return [this] { broadcast_updates(); };
}

NamedTensors Zero::collect(const std::string& what, NamedTensors mine, bool writer) const {
  auto all = shards_state() ? gather_to_writer(rt_, what, mine, writer) : (writer ? std::move(mine) : NamedTensors{});
  if (writer) sort_by_parameter(all);
  return all;
}

Zero::Whole::Whole(Zero& zero, bool fill) : gathered_(zero.gathered_.get()) {
  if (gathered_) gathered_->gather_all(fill);
}

Zero::Whole::~Whole() {
  if (gathered_) gathered_->release_all();
}

bool Zero::owns(const std::string& name) const {
  const auto it = index_.find(name);
  return it != index_.end() && owned_index_[it->second] >= 0;
}

int Zero::owner_of(const std::string& entry) const {
  const auto it = index_.find(entry.substr(0, entry.find('/')));
  return it == index_.end() ? 0 : reducer_.shard_plan().owner.at(it->second);
}

int64_t Zero::order_of(const std::string& entry) const {
  const auto it = index_.find(entry.substr(0, entry.find('/')));
  return static_cast<int64_t>(it == index_.end() ? index_.size() : it->second);
}

void Zero::sort_by_parameter(NamedTensors& entries) const {
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const auto& a, const auto& b) { return order_of(a.first) < order_of(b.first); });
}

torch::Tensor Zero::sum_over_parameters(const torch::Tensor& mine) const {
  auto all = torch::zeros({static_cast<int64_t>(shapes_.size()), mine.size(1)}, torch::kFloat64);
  for (size_t i = 0; i < owned_.size(); ++i) all[order_of(owned_[i].first)].copy_(mine[static_cast<int64_t>(i)]);
  if (shards_state()) {
    auto on_device = all.to(rt_.device());
    rt_.all_reduce(on_device);
    all = on_device.to(torch::kCPU);
  }
  auto out = torch::zeros({all.size(1)}, torch::kFloat64);
  const auto rows = all.accessor<double, 2>();
  auto sums = out.accessor<double, 1>();
  for (int64_t r = 0; r < all.size(0); ++r) {
    for (int64_t c = 0; c < all.size(1); ++c) sums[c] += rows[r][c];
  }
  return out;
}

void Zero::regroup() {
  if (stage_ > 0) throw std::logic_error("Zero::regroup: stage 0 only");
  reducer_.regroup();
  const auto grads = reducer_.flat_gradients();  // one per bucket, in order, when whole
  for (size_t i = 0; i < flat_.size(); ++i) flat_[i].grads = grads.at(i);
}

std::vector<Zero::ShareSegment> Zero::share_of(int owner) const {
  const auto& plan = reducer_.shard_plan();
  std::vector<int> index(plan.owner.size(), -1);  // parameter -> its place among the owner's
  int next = 0;
  for (size_t k = 0; k < plan.owner.size(); ++k) {
    if (!shards_state() || plan.owner[k] == owner) index[k] = next++;
  }
  std::vector<ShareSegment> out;
  for (size_t i = 0; i < flat_.size(); ++i) {
    const auto& whole = flat_[i];
    for (size_t s = 0; s < plan.segments[i].size(); ++s) {
      const auto& seg = plan.segments[i][s];
      if (seg.owner != owner) continue;
      ShareSegment share{i, s, {}};
      share.layout.dtype = whole.layout.dtype;
      share.layout.numel = seg.numel();
      for (size_t j = seg.first; j < seg.first + seg.count; ++j) {
        share.layout.params.push_back(static_cast<size_t>(index.at(whole.layout.params[j])));
        share.layout.offsets.push_back(whole.layout.offsets[j] - seg.begin);
      }
      out.push_back(std::move(share));
    }
  }
  return out;
}

torch::Tensor Zero::segment_values(size_t bucket, size_t segment) const {
  const auto& seg = reducer_.shard_plan().segments.at(bucket).at(segment);
  return gathered_ ? gathered_->segment(bucket, segment) : flat_.at(bucket).params.narrow(0, seg.begin, seg.numel());
}

std::vector<parallel::FlatBucket> Zero::optimizer_buckets() const {
  // Unsharded gradients are the buckets' own; sharded ones (also on one process, when they
  // live in host memory) are the reducer's segments.
  if (!shards_state() && !reducer_.gradients_sharded()) return flat_;
  std::vector<parallel::FlatBucket> out;
  for (auto& share : share_of(rt_.rank())) {
    out.push_back({segment_values(share.bucket, share.segment), reducer_.segment_gradient(share.bucket, share.segment),
                   std::move(share.layout)});
  }
  return out;
}

std::string Zero::describe(bool deterministic) const {
  if (stage_ == 0) return "";
  if (!shards_state()) return fmt::format(", train.zero_stage {} (one process: nothing to split)", stage_);
  const auto& plan = reducer_.shard_plan();
  const char* what = gathered_                      ? "the weights, optimizer state, EMA and gradients"
                     : reducer_.gradients_sharded() ? "the optimizer state, EMA and gradients"
                                                    : "the optimizer state and EMA";
  return fmt::format(
      ", train.zero_stage {}: this rank keeps {} of {} parameters ({:.1f}% of the elements){}", stage_, what,
      owned_.size(),
      100.0 * static_cast<double>(plan.owned_elements(rt_.rank())) /
          static_cast<double>(std::max<int64_t>(1, plan.total_elements())),
      stage_ >= 2 && deterministic ? " (train.deterministic: every rank keeps the whole integer gradient sums)" : "");
}

void Zero::broadcast_updates() {
  torch::NoGradGuard no_grad;
  const auto& plan = reducer_.shard_plan();
  for (size_t i = 0; i < flat_.size(); ++i) {
    for (const auto& seg : plan.segments[i]) {
      auto part = flat_[i].params.narrow(0, seg.begin, seg.numel());  // a swapped block's: in host memory
      rt_.broadcast(part, seg.owner);
    }
  }
}

NamedTensors gather_to_writer(dist::Runtime& rt, const std::string& what, const NamedTensors& own, bool writer) {
  if (writer != (rt.rank() == 0)) throw std::logic_error("gather_to_writer: rank 0 writes");
  nlohmann::json header = nlohmann::json::array();
  for (const auto& [name, t] : own) header.push_back({name, static_cast<int>(t.scalar_type()), t.sizes().vec()});
  const auto headers = rt.all_gather(what, header.dump());  // collective
  NamedTensors out;
  if (writer) out = own;
  // Every other rank's share comes to rank 0 as a stream of bytes, in chunks.
  for (int r = 1; r < rt.world_size(); ++r) {
    std::vector<torch::Tensor> tensors;  // the sender's, or the writer's new ones
    NamedTensors received;
    int64_t total = 0;
    if (r == rt.rank()) {
      for (const auto& [name, t] : own) tensors.push_back(t);
    }
    for (const auto& entry : nlohmann::json::parse(headers[static_cast<size_t>(r)])) {
      auto t = torch::empty(entry.at(2).get<std::vector<int64_t>>(),
                            torch::TensorOptions().dtype(static_cast<at::ScalarType>(entry.at(1).get<int>())));
      total += static_cast<int64_t>(t.nbytes());
      if (writer) {
        tensors.push_back(t);
        received.emplace_back(entry.at(0).get<std::string>(), t);
      }
    }
    dist::broadcast_tensors(rt, r, total, tensors);  // collective
    out.insert(out.end(), received.begin(), received.end());
  }
  return out;
}

std::optional<PartState> ShardedPart::gather_state(bool writer) const {
  if (!zero_.shards_state()) return inner_.gather_state(writer);
  const PartState mine = inner_.save_state();
  auto all = gather_to_writer(rt_, "checkpoint " + state_name(), PartState::tensors_of(&mine), writer);
  if (!writer) return std::nullopt;
  zero_.sort_by_parameter(all);
  return PartState{mine.json, std::move(all), mine.metadata};
}

std::optional<PartState> WholeModelPart::gather_state(bool writer) const {
  Zero::Whole whole(zero_);  // collective at stage 3
  return inner_.gather_state(writer);
}

void WholeModelPart::restore_state(const PartState* saved, const std::string& source) {
  Zero::Whole whole(zero_, /*fill=*/saved == nullptr);  // the checkpoint's values replace all
  inner_.restore_state(saved, source);
}

void ShardedPart::restore_state(const PartState* saved, const std::string& source) {
  const auto& all = PartState::tensors_of(saved);
  if (!zero_.shards_state() || all.empty()) {
    inner_.restore_state(saved, source);
    return;
  }
  PartState mine{saved->json, NamedTensors{}, {}};
  for (const auto& [name, t] : all) {
    if (zero_.owns(name.substr(0, name.find('/')))) mine.tensors->emplace_back(name, t);
  }
  if (mine.tensors->empty()) return;  // this rank owns no parameter: nothing of it to keep
  inner_.restore_state(&mine, source);
}

}  // namespace sana::parallel
