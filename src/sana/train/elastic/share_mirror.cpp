#include "sana/train/elastic/share_mirror.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sana/train/step/train_step.h"

namespace sana::train {

namespace {

// Tensors end to end as bytes on `device`, and their description to take them apart again.
nlohmann::json describe(const NamedTensors& entries) {
  auto out = nlohmann::json::array();
  for (const auto& [name, t] : entries) out.push_back({name, static_cast<int>(t.scalar_type()), t.sizes().vec()});
  return out;
}

torch::Tensor as_bytes(const torch::Tensor& t, const torch::Device& device) {
  return t.detach().to(device).contiguous().view({-1}).view(torch::kByte);
}

NamedTensors unpack(const nlohmann::json& described, const torch::Tensor& bytes, int64_t& at) {
  NamedTensors out;
  for (const auto& entry : described) {
    const auto type = static_cast<at::ScalarType>(entry.at(1).get<int>());
    auto t = torch::empty(entry.at(2).get<std::vector<int64_t>>(), torch::dtype(type));
    const auto n = static_cast<int64_t>(t.nbytes());
    t.view({-1}).view(torch::kByte).copy_(bytes.narrow(0, at, n));
    at += n;
    out.emplace_back(entry.at(0).get<std::string>(), t);
  }
  return out;
}

NamedTensors on_cpu(const NamedParams& entries) {
  NamedTensors out;
  for (const auto& [name, t] : entries) out.emplace_back(name, t.detach().to(torch::kCPU).clone());
  return out;
}

}  // namespace

int mirror_stride(const std::vector<std::string>& nodes) {
  const int n = static_cast<int>(nodes.size());
  int best = 1, most = -1;
  for (int s = 1; s < n; ++s) {
    int apart = 0;
    for (int r = 0; r < n; ++r) apart += nodes[static_cast<size_t>(r)] != nodes[static_cast<size_t>((r + s) % n)];
    if (apart > most) {
      most = apart;
      best = s;
    }
  }
  return best;
}

ShareMirror::ShareMirror(dist::Runtime& rt, const parallel::Zero& zero, const parallel::Reducer& reducer,
                         const OptimizerOptions& optimizer, double ema_rate, EmaPlacement ema_placement)
    : rt_(rt), zero_(zero), reducer_(reducer) {
  const int world = rt.world_size(), rank = rt.rank();
  stride_ = mirror_stride(rt.member_nodes());
  successor_ = (rank + stride_) % world;
  predecessor_ = (rank + world - stride_) % world;
  partner_ = rt.members().at(static_cast<size_t>(predecessor_));
  const auto& plan = reducer.shard_plan();
  for (const auto& share : zero.share_of(rank)) {
    own_.push_back({share.bucket, share.segment, own_numel_, share.layout.numel});
    own_numel_ += share.layout.numel;
  }
  const auto theirs = zero.share_of(predecessor_);
  int64_t total = 0;
  for (const auto& share : theirs) total += share.layout.numel;
  const auto dtype = theirs.empty() ? at::kFloat : static_cast<at::ScalarType>(theirs.front().layout.dtype);
  const auto options = torch::TensorOptions().dtype(dtype).device(rt.device());
  values_ = torch::zeros({total}, options);
  grads_ = torch::zeros({total}, options);
  // The partner's parameters in registration order: the indices of its segments' layouts.
  const auto& shapes = zero.parameter_shapes();
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (plan.owner.at(k) == predecessor_) params_.emplace_back(shapes[k].first, torch::Tensor());
  }
  std::vector<parallel::FlatBucket> buckets;
  int64_t at = 0;
  for (const auto& share : theirs) {
    mirrored_.push_back({share.bucket, share.segment, at, share.layout.numel});
    for (size_t j = 0; j < share.layout.params.size(); ++j) {
      auto& [name, param] = params_.at(share.layout.params[j]);
      const auto& shape = shapes.at(static_cast<size_t>(zero.order_of(name))).second;
      int64_t numel = 1;
      for (auto d : shape) numel *= d;
      const int64_t offset = at + share.layout.offsets[j];
      param = values_.narrow(0, offset, numel).view(shape);
      param.mutable_grad() = grads_.narrow(0, offset, numel).view(shape);
    }
    buckets.push_back({values_.narrow(0, at, share.layout.numel), grads_.narrow(0, at, share.layout.numel),
                       share.layout});
    at += share.layout.numel;
  }
  optimizer_ = make_optimizer(optimizer, params_);
  optimizer_->use_flat_buckets(std::move(buckets));
  ema_.emplace(params_, ema_rate, /*checkpointed=*/true, std::map<std::string, std::string>{}, ema_placement);
}

void ShareMirror::seed(const Optimizer& own_optimizer, const Ema& own_ema) {
  torch::NoGradGuard no_grad;
  const auto device = rt_.device();
  std::vector<torch::Tensor> values;
  for (const auto& s : own_) values.push_back(zero_.segment_values(s.bucket, s.segment).detach().reshape({-1}));
  const NamedTensors state = on_cpu(own_optimizer.state()), averages = own_ema.named_averages();
  const auto headers = rt_.all_gather("share mirror", nlohmann::json{{"optimizer", describe(state)},
                                                                     {"ema", describe(averages)}}.dump());
  std::vector<torch::Tensor> parts;
  if (!values.empty()) parts.push_back(as_bytes(torch::cat(values), device));
  for (const auto& [name, t] : state) parts.push_back(as_bytes(t, device));
  for (const auto& [name, t] : averages) parts.push_back(as_bytes(t, device));
  const auto send = parts.empty() ? torch::empty({0}, torch::dtype(torch::kByte).device(device)) : torch::cat(parts);
  // What the partner sends: its segments' values, then its state and averages as described.
  const auto theirs = nlohmann::json::parse(headers.at(static_cast<size_t>(predecessor_)));
  int64_t expected = static_cast<int64_t>(values_.nbytes());
  for (const auto* key : {"optimizer", "ema"}) {
    for (const auto& entry : theirs.at(key)) {
      auto shape = entry.at(2).get<std::vector<int64_t>>();
      expected += torch::empty(shape, torch::dtype(static_cast<at::ScalarType>(entry.at(1).get<int>()))).nbytes();
    }
  }
  auto received = torch::empty({expected}, torch::dtype(torch::kByte).device(device));
  rt_.send_receive(send, successor_, received, predecessor_);
  received = received.to(torch::kCPU);
  const auto value_bytes = static_cast<int64_t>(values_.nbytes());
  values_.view({-1}).view(torch::kByte).copy_(received.narrow(0, 0, value_bytes));
  int64_t at = value_bytes;
  const auto state_in = unpack(theirs.at("optimizer"), received, at);
  const auto averages_in = unpack(theirs.at("ema"), received, at);
  optimizer_->load_state(NamedParams(state_in.begin(), state_in.end()));
  optimizer_->weights_changed();
  if (ema_->enabled()) {
    const PartState saved{nullptr, averages_in, {}};
    ema_->restore_state(&saved, fmt::format("the mirror of rank {}", partner_));
  }
}

void ShareMirror::take_gradients() {
  torch::NoGradGuard no_grad;
  if (!reducer_.gradients_sharded()) {  // stage 1: every rank has every reduced gradient
    const auto whole = reducer_.flat_gradients();
    const auto& plan = reducer_.shard_plan();
    for (const auto& m : mirrored_) {
      const auto& seg = plan.segments.at(m.bucket).at(m.segment);
      grads_.narrow(0, m.offset, m.numel).copy_(whole.at(m.bucket).narrow(0, seg.begin, seg.numel()));
    }
    return;
  }
  std::vector<torch::Tensor> mine;
  for (const auto& s : own_) mine.push_back(reducer_.segment_gradient(s.bucket, s.segment).reshape({-1}));
  const auto send = mine.empty() ? torch::empty({0}, grads_.options()) : torch::cat(mine);
  rt_.send_receive(send, successor_, grads_, predecessor_);  // collective: the ring
}

void ShareMirror::update_ema_at(int64_t step) { ema_->update_at(step); }

void ShareMirror::apply_step(int64_t step, double lr, double grad_norm, double loss_scale, double clip) {
  unscale_and_clip({grads_}, grad_norm, loss_scale, clip);
  ema_->update_at(step);
  optimizer_->step(lr);
}

NamedTensors ShareMirror::parameters() const { return on_cpu(params_); }

NamedTensors ShareMirror::optimizer_state() const { return on_cpu(optimizer_->state()); }

NamedTensors ShareMirror::averages() const { return ema_->named_averages(); }

int64_t ShareMirror::bytes() const {
  int64_t total = static_cast<int64_t>(values_.nbytes() + grads_.nbytes());
  for (const auto& [name, t] : optimizer_->state()) total += static_cast<int64_t>(t.nbytes());
  for (const auto& t : ema_->averages()) total += static_cast<int64_t>(t.nbytes());
  return total;
}

}  // namespace sana::train
