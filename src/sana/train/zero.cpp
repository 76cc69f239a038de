#include "sana/train/zero.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace sana::train {

namespace {

int64_t storage_bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// A segment's memory, given back (its parameters keep their shapes and their views) or
// taken again (the same storage, so tensors autograd saved see the new memory).
void drop_memory(torch::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}

void take_memory(torch::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  const auto n = static_cast<size_t>(storage_bytes(t));
  impl->set_data_ptr_noswap(impl->allocator()->allocate(n));
  impl->set_nbytes(n);
}

}  // namespace

struct GatheredParameters::HookTarget {
  std::mutex mutex;
  GatheredParameters* owner = nullptr;
};

namespace {

struct AccumulatedHook : public torch::autograd::FunctionPostHook {
  AccumulatedHook(std::shared_ptr<GatheredParameters::HookTarget> target, size_t index)
      : target_(std::move(target)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override;
  std::shared_ptr<GatheredParameters::HookTarget> target_;
  size_t index_;
};

}  // namespace

GatheredParameters::GatheredParameters(dist::Runtime& rt, const dist::ShardPlan& plan,
                                       std::vector<dist::FlatBucket>& flat, const NamedParams& params,
                                       at::ScalarType compute)
    : rt_(rt), params_(params), half_(compute != at::kFloat), target_(std::make_shared<HookTarget>()) {
  if (half_ && compute != at::kBFloat16 && compute != at::kHalf) {
    throw std::invalid_argument("GatheredParameters: gathers in fp32, bf16 or fp16");
  }
  torch::NoGradGuard no_grad;
  unit_of_.resize(params.size());
  size_t units = 1;
  for (size_t k = 0; k < params.size(); ++k) {
    unit_of_[k] = model::gathering_unit(params[k].first);
    units = std::max(units, unit_of_[k] + 1);
  }
  unit_segments_.resize(units);
  unit_params_.assign(units, 0);
  for (size_t k = 0; k < params.size(); ++k) ++unit_params_[unit_of_[k]];
  for (size_t i = 0; i < flat.size(); ++i) {
    segs_.emplace_back();
    for (size_t s = 0; s < plan.segments[i].size(); ++s) {
      const auto& seg = plan.segments[i][s];
      Segment mine;
      mine.owner = seg.owner;
      mine.data = flat[i].params.narrow(0, seg.begin, seg.numel()).clone();
      std::vector<size_t> units_here;
      for (size_t j = seg.first; j < seg.first + seg.count; ++j) {
        const size_t k = flat[i].layout.params[j];
        mine.members.emplace_back(k, flat[i].layout.offsets[j] - seg.begin);
        units_here.push_back(unit_of_[k]);
      }
      std::sort(units_here.begin(), units_here.end());
      units_here.erase(std::unique(units_here.begin(), units_here.end()), units_here.end());
      for (size_t u : units_here) unit_segments_[u].emplace_back(i, s);
      point(mine, mine.data);
      if (mine.owner != rt.rank()) drop_memory(mine.data);
      if (half_) {
        mine.half = torch::empty({seg.numel()}, mine.data.options().dtype(compute));
        drop_memory(mine.half);
      }
      segs_.back().push_back(std::move(mine));
    }
    flat[i].params = torch::Tensor();  // the whole bucket goes: each segment has its own memory now
  }
  unit_done_.assign(units, 0);
  held_.assign(units, 0);
  target_->owner = this;
  for (size_t k = 0; k < params.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params[k].second);
    acc->add_post_hook(std::make_unique<AccumulatedHook>(target_, k));
    accumulators_.push_back(std::move(acc));
  }
}

GatheredParameters::~GatheredParameters() {
  std::lock_guard<std::mutex> lock(target_->mutex);
  target_->owner = nullptr;
}

namespace {

torch::autograd::variable_list AccumulatedHook::operator()(const torch::autograd::variable_list& outputs,
                                                           const torch::autograd::variable_list& /*inputs*/) {
  std::lock_guard<std::mutex> lock(target_->mutex);
  if (target_->owner) target_->owner->accumulated(index_);
  return outputs;
}

}  // namespace

void GatheredParameters::gather(size_t unit) {
  torch::NoGradGuard no_grad;
  for (const auto& [i, s] : unit_segments_[unit]) {
    auto& seg = segs_[i][s];
    if (seg.refs++ == 0) acquire_compute(seg);  // collective: every rank gathers the same units in the same order
  }
}

void GatheredParameters::point(const Segment& seg, const torch::Tensor& to) {
  for (const auto& [k, offset] : seg.members) {
    auto& p = params_[k].second;
    auto* meta = torch::autograd::impl::get_autograd_meta(p);
    auto accumulator = meta ? meta->grad_accumulator_.lock() : nullptr;
    p.set_data(to.narrow(0, offset, p.numel()).view(p.sizes()));
    if (accumulator && meta->grad_accumulator_.expired()) {
      // A change of dtype makes set_data() forget the accumulator; the hooks are on it, and
      // the engine casts the gradients arriving there to its recorded fp32.
      std::lock_guard<std::mutex> lock(meta->mutex_);
      meta->grad_accumulator_ = accumulator;
    }
  }
}

void GatheredParameters::acquire_compute(Segment& seg) {
  if (!half_) {
    acquire(seg, true);
    return;
  }
  take_memory(seg.half);
  gathered_ += storage_bytes(seg.half);
  peak_ = std::max(peak_, gathered_);
  if (seg.owner == rt_.rank()) seg.half.copy_(seg.data);
  rt_.broadcast(seg.half, seg.owner);  // collective
  point(seg, seg.half);
}

void GatheredParameters::give_back(Segment& seg) {
  if (!half_) {
    drop(seg);
    return;
  }
  point(seg, seg.data);
  drop_memory(seg.half);
  gathered_ -= storage_bytes(seg.half);
}

void GatheredParameters::acquire(Segment& seg, bool fill) {
  if (seg.owner != rt_.rank()) {
    take_memory(seg.data);
    gathered_ += storage_bytes(seg.data);
    peak_ = std::max(peak_, gathered_);
  }
  if (fill) rt_.broadcast(seg.data, seg.owner);  // collective
}

void GatheredParameters::drop(Segment& seg) {
  if (seg.owner == rt_.rank()) return;
  drop_memory(seg.data);
  gathered_ -= storage_bytes(seg.data);
}

void GatheredParameters::release(size_t unit) {
  for (const auto& [i, s] : unit_segments_[unit]) {
    auto& seg = segs_[i][s];
    if (--seg.refs == 0) give_back(seg);
  }
}

void GatheredParameters::forward_begins() {
  if (whole_) return;
  std::fill(unit_done_.begin(), unit_done_.end(), 0);
  if (held_[0]) return;  // an earlier micro-step's forward holds it
  gather(0);
  held_[0] = 1;
}

void GatheredParameters::block_forward(int64_t block, bool begins) {
  if (whole_) return;
  const auto unit = static_cast<size_t>(block) + 1;
  if (begins) {
    gather(unit);
  } else {
    release(unit);
  }
}

void GatheredParameters::backward_reaches(int64_t block) {
  const auto unit = static_cast<size_t>(block) + 1;
  if (whole_ || held_[unit]) return;
  gather(unit);
  held_[unit] = 1;
}

void GatheredParameters::forward_ends(bool backward_follows) {
  if (whole_ || backward_follows || !held_[0]) return;
  release(0);
  held_[0] = 0;
}

void GatheredParameters::accumulated(size_t param) {
  if (whole_) return;
  const size_t unit = unit_of_[param];
  if (++unit_done_[unit] < unit_params_[unit] || !held_[unit]) return;
  release(unit);  // the unit's backward is over: every parameter of it has its gradient
  held_[unit] = 0;
}

void GatheredParameters::step_done() {
  if (whole_) return;
  for (size_t u = 0; u < held_.size(); ++u) {
    if (!held_[u]) continue;
    release(u);
    held_[u] = 0;
  }
}

void GatheredParameters::gather_all(bool fill) {
  step_done();
  torch::NoGradGuard no_grad;
  for (auto& bucket : segs_) {
    for (auto& seg : bucket) acquire(seg, fill);
  }
  whole_ = true;
}

void GatheredParameters::release_all() {
  for (auto& bucket : segs_) {
    for (auto& seg : bucket) {
      seg.refs = 0;
      drop(seg);
    }
  }
  whole_ = false;
}

Zero::Zero(int stage, dist::Runtime& rt, const NamedParams& params, dist::Reducer& reducer, model::SanaMSImpl& model,
           at::ScalarType gather_dtype)
    : stage_(stage), rt_(rt), reducer_(reducer), flat_(reducer.flatten_parameters()), model_(model) {
  const auto& plan = reducer.shard_plan();
  owned_index_.assign(params.size(), -1);
  for (size_t k = 0; k < params.size(); ++k) {
    index_[params[k].first] = k;
    if (shards_state() && plan.owner.at(k) != rt.rank()) continue;
    owned_index_[k] = static_cast<int>(owned_.size());
    owned_.push_back(params[k]);
  }
  if (stage_ >= 3 && shards_state()) {
    gathered_ = std::make_unique<GatheredParameters>(rt, plan, flat_, params, gather_dtype);
    model_.set_param_gathering(gathered_.get());
  }
}

Zero::~Zero() {
  if (gathered_) model_.set_param_gathering(nullptr);
}

void Zero::step_done() {
  if (gathered_) gathered_->step_done();
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

void Zero::sort_by_parameter(NamedTensors& entries) const {
  const auto rank_of = [&](const std::string& entry) {
    const auto it = index_.find(entry.substr(0, entry.find('/')));
    return it == index_.end() ? index_.size() : it->second;
  };
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const auto& a, const auto& b) { return rank_of(a.first) < rank_of(b.first); });
}

std::vector<dist::FlatBucket> Zero::optimizer_buckets() const {
  if (!shards_state()) return flat_;
  std::vector<dist::FlatBucket> out;
  const auto& plan = reducer_.shard_plan();
  for (size_t i = 0; i < flat_.size(); ++i) {
    const auto& whole = flat_[i];
    for (size_t s = 0; s < plan.segments[i].size(); ++s) {
      const auto& seg = plan.segments[i][s];
      if (seg.owner != rt_.rank()) continue;
      dist::GradBucket layout;
      layout.dtype = whole.layout.dtype;
      layout.numel = seg.numel();
      for (size_t j = seg.first; j < seg.first + seg.count; ++j) {
        layout.params.push_back(static_cast<size_t>(owned_index_.at(whole.layout.params[j])));
        layout.offsets.push_back(whole.layout.offsets[j] - seg.begin);
      }
      auto params = gathered_ ? gathered_->segment(i, s) : whole.params.narrow(0, seg.begin, seg.numel());
      out.push_back({params, reducer_.segment_gradient(i, s), layout});
    }
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

void Zero::gather_parameters() {
  if (!shards_state() || gathered_) return;  // stage 3 gathers when the forward needs them
  torch::NoGradGuard no_grad;
  const auto& plan = reducer_.shard_plan();
  for (size_t i = 0; i < flat_.size(); ++i) {
    for (const auto& seg : plan.segments[i]) {
      auto part = flat_[i].params.narrow(0, seg.begin, seg.numel());
      rt_.broadcast(part, seg.owner);
    }
  }
}

namespace {

constexpr int64_t kGatherChunk = int64_t{64} << 20;

// One CPU tensor's bytes as a flat uint8 tensor sharing its memory.
torch::Tensor bytes_of_tensor(const torch::Tensor& t) {
  return torch::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())}, torch::kUInt8);
}

// Copies `n` bytes between the CPU `chunk` and the tensors' bytes laid end to end (from
// `stream_at`): into the chunk when `to_chunk`, else out of it.
void move_bytes(torch::Tensor& chunk, const std::vector<torch::Tensor>& pieces, int64_t stream_at, int64_t n,
                bool to_chunk) {
  int64_t start = 0;
  for (const auto& piece : pieces) {
    const int64_t len = piece.numel();
    const int64_t lo = std::max(start, stream_at), hi = std::min(start + len, stream_at + n);
    if (lo < hi) {
      auto in_piece = piece.narrow(0, lo - start, hi - lo);
      auto in_chunk = chunk.narrow(0, lo - stream_at, hi - lo);
      if (to_chunk) {
        in_chunk.copy_(in_piece);
      } else {
        in_piece.copy_(in_chunk);
      }
    }
    start += len;
  }
}

}  // namespace

NamedTensors gather_to_writer(dist::Runtime& rt, const std::string& what, const NamedTensors& own, bool writer) {
  if (writer != (rt.rank() == 0)) throw std::logic_error("gather_to_writer: rank 0 writes");
  nlohmann::json header = nlohmann::json::array();
  for (const auto& [name, t] : own) header.push_back({name, static_cast<int>(t.scalar_type()), t.sizes().vec()});
  const auto headers = rt.all_gather(what, header.dump());  // collective
  NamedTensors out;
  if (writer) out = own;
  // Every other rank's share comes to rank 0 as a stream of bytes, in chunks.
  for (int r = 1; r < rt.world_size(); ++r) {
    std::vector<torch::Tensor> held, pieces;  // the sender's tensors (on the CPU) and their bytes, or the writer's new ones'
    NamedTensors received;
    int64_t total = 0;
    if (r == rt.rank()) {
      for (const auto& [name, t] : own) {
        held.push_back(t.to(torch::kCPU).contiguous());
        pieces.push_back(bytes_of_tensor(held.back()));
      }
    }
    for (const auto& entry : nlohmann::json::parse(headers[static_cast<size_t>(r)])) {
      auto t = torch::empty(entry.at(2).get<std::vector<int64_t>>(),
                            torch::TensorOptions().dtype(static_cast<at::ScalarType>(entry.at(1).get<int>())));
      total += static_cast<int64_t>(t.nbytes());
      if (writer) {
        pieces.push_back(bytes_of_tensor(t));
        received.emplace_back(entry.at(0).get<std::string>(), t);
      }
    }
    for (int64_t at = 0; at < total; at += kGatherChunk) {
      const int64_t n = std::min(kGatherChunk, total - at);
      auto chunk = torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8).device(rt.device()));
      if (r == rt.rank()) {
        auto host = torch::empty({n}, torch::kUInt8);
        move_bytes(host, pieces, at, n, true);
        chunk.copy_(host);
      }
      rt.broadcast(chunk, r);  // collective
      if (writer) {
        auto host = chunk.to(torch::kCPU);
        move_bytes(host, pieces, at, n, false);
      }
    }
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
  return PartState{mine.json, std::move(all)};
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
  PartState mine{saved->json, NamedTensors{}};
  for (const auto& [name, t] : all) {
    if (zero_.owns(name.substr(0, name.find('/')))) mine.tensors->emplace_back(name, t);
  }
  if (mine.tensors->empty()) return;  // this rank owns no parameter: nothing of it to keep
  inner_.restore_state(&mine, source);
}

}  // namespace sana::train
