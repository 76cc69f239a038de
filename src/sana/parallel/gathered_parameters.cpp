#include "sana/parallel/gathered_parameters.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace sana::parallel {

size_t gathering_unit(const std::string& name) {
  for (const std::string prefix : {"blocks.", "transformer.transformer_blocks."}) {
    if (name.rfind(prefix, 0) == 0) return static_cast<size_t>(std::stoll(name.substr(prefix.size()))) + 1;
  }
  const std::string control = "controlnet.";
  if (name.rfind(control, 0) == 0) return static_cast<size_t>(std::stoll(name.substr(control.size()))) + 2;
  return 0;
}

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

GatheredParameters::GatheredParameters(dist::Runtime& rt, const parallel::ShardPlan& plan,
                                       std::vector<parallel::FlatBucket>& flat, const NamedParams& params,
                                       at::ScalarType compute)
    : rt_(rt), params_(params), half_(compute != at::kFloat) {
  if (half_ && compute != at::kBFloat16 && compute != at::kHalf) {
    throw std::invalid_argument("GatheredParameters: gathers in fp32, bf16 or fp16");
  }
  torch::NoGradGuard no_grad;
  unit_of_.resize(params.size());
  size_t units = 1;
  for (size_t k = 0; k < params.size(); ++k) {
    unit_of_[k] = gathering_unit(params[k].first);
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
  forward_.assign(units, 0);
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params) tensors.push_back(p);
  hooks_.emplace(tensors, [this](size_t k) { accumulated(k); });
}

GatheredParameters::~GatheredParameters() { hooks_.reset(); }


void GatheredParameters::hold(size_t unit) {
  torch::NoGradGuard no_grad;
  for (const auto& [i, s] : unit_segments_[unit]) {
    auto& seg = segs_[i][s];
    if (seg.refs++ == 0) start_gather(seg);  // collective: every rank holds the same units in the same order
  }
}

void GatheredParameters::ready(size_t unit) {
  for (const auto& [i, s] : unit_segments_[unit]) finish_gather(segs_[i][s]);
}

void GatheredParameters::release(size_t unit) {
  for (const auto& [i, s] : unit_segments_[unit]) {
    auto& seg = segs_[i][s];
    if (--seg.refs == 0) give_back(seg);
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

void GatheredParameters::take(torch::Tensor& t) {
  take_memory(t);
  gathered_ += storage_bytes(t);
  peak_ = std::max(peak_, gathered_);
}

void GatheredParameters::untake(torch::Tensor& t) {
  drop_memory(t);
  gathered_ -= storage_bytes(t);
}

void GatheredParameters::acquire(Segment& seg, bool fill) {
  if (seg.owner != rt_.rank()) take(seg.data);
  if (fill) rt_.broadcast(seg.data, seg.owner);  // collective
}

void GatheredParameters::drop(Segment& seg) {
  if (seg.owner != rt_.rank()) untake(seg.data);
}

void GatheredParameters::start_gather(Segment& seg) {
  auto& into = half_ ? seg.half : seg.data;
  if (half_ || seg.owner != rt_.rank()) take(into);
  if (half_ && seg.owner == rt_.rank()) into.copy_(seg.data);
  seg.pending = rt_.broadcast_async(into, seg.owner);  // collective
  seg.ready = false;
}

void GatheredParameters::finish_gather(Segment& seg) {
  if (seg.ready) return;
  rt_.wait(seg.pending, "gathering parameters (ZeRO stage 3)");
  seg.pending.reset();
  if (half_) point(seg, seg.half);
  seg.ready = true;
}

void GatheredParameters::give_back(Segment& seg) {
  finish_gather(seg);  // a fetch still under way ends first: its memory is written to
  if (half_) point(seg, seg.data);
  if (half_) {
    untake(seg.half);
  } else {
    drop(seg);
  }
  seg.ready = false;
}

// The forward holds unit 0 from its start to the end of the backward, and each block from
// its start to its end; while block k runs, block k + 1 is fetched (its broadcasts under way
// during k's compute). The backward holds each block from the hook on its output until its
// parameters all have gradients, and fetches the block before it as soon as the block after
// it is released, so at most two blocks are held at once in either direction.
void GatheredParameters::forward_begins() {
  if (whole_) return;
  std::fill(unit_done_.begin(), unit_done_.end(), 0);
  if (!held_[0]) {  // else an earlier micro-step's forward holds it
    hold(0);
    held_[0] = 1;
  }
  ready(0);
  fetch_for_forward(1);
}

void GatheredParameters::fetch_for_forward(size_t unit) {
  if (unit >= forward_.size() || forward_[unit]) return;
  hold(unit);
  forward_[unit] = 1;
}

void GatheredParameters::block_forward(int64_t block, bool begins) {
  const auto unit = static_cast<size_t>(block) + 1;
  if (whole_ || unit >= unit_segments_.size()) return;  // past the last block with a trained parameter
  if (begins) {
    fetch_for_forward(unit);
    ready(unit);
    fetch_for_forward(unit + 1);
  } else {
    release(unit);
    forward_[unit] = 0;
  }
}

void GatheredParameters::backward_reaches(int64_t block) {
  const auto unit = static_cast<size_t>(block) + 1;
  if (whole_ || unit >= unit_segments_.size()) return;  // past the last block with a trained parameter
  if (!held_[unit]) {
    hold(unit);
    held_[unit] = 1;
  }
  ready(unit);
  fetch_for_backward(unit);
}

void GatheredParameters::fetch_for_backward(size_t unit) {
  const size_t before = unit - 1;  // the block whose backward comes next
  if (before < 1 || held_[before] || (unit + 1 < held_.size() && held_[unit + 1])) return;
  hold(before);
  held_[before] = 1;
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
  if (unit >= 2 && held_[unit - 1]) fetch_for_backward(unit - 1);  // the block now running: the one before it
}

void GatheredParameters::step_done() {
  if (whole_) return;
  for (size_t u = 0; u < held_.size(); ++u) {
    if (held_[u]) release(u);
    if (forward_[u]) release(u);
    held_[u] = forward_[u] = 0;
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

}  // namespace sana::parallel
