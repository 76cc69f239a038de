#include "sana/train/report/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <atomic>
#include <numeric>
#include <utility>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/parallel/gathered_parameters.h"
#include "sana/parallel/bucket_assignment.h"
#include "sana/parallel/shard_plan.h"
#include "sana/model/controlnet.h"
#include "sana/model/frozen_storage.h"
#include "sana/model/swapped_blocks.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/model/spec.h"
#include "sana/model/working_weights.h"
#include "sana/torch_compat.h"
#include "sana/train/optim/adafactor.h"
#include "sana/train/optim/adamw8bit.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/report/activation_terms.h"
#include "sana/train/report/counting_allocator.h"
#include "sana/util/log.h"

namespace sana::train {

using activation_terms::measure;
using activation_terms::per_sample_of;
using activation_terms::add_stage2_graphs;
using activation_terms::step_activations;

double MemoryEstimate::activations_for_config() const {
  return checkpointing ? activations_checkpointed : activations;
}

double MemoryEstimate::total() const {
  return weights + gradients + optimizer + ema + gathered + working + mirror + converted + in_flight + teacher + heads +
         swapped_in + activations_for_config();
}

namespace {

// What each rank keeps of its parameters, gradients, optimizer state and EMA, in bytes:
// the reducer's flat buckets (each parameter 64-byte aligned, train/options/core_options.h's
// bucket caps) for parameters and gradients; under train.zero_stage the owned segments
// (parallel/shard_plan.h) for the gradients (stage 2) and AdamW's moments and the
// owned parameters for CAME's state and the EMA (stages 1, 2); AdamW's moments in buckets
// of the same layout, Lion's one moment per parameter, CAME's per parameter (factored for 2-D weights and 1x1 convolutions,
// 8-bit first moments under CAME8bit), AdamW8bit's per parameter (adamw8bit.h), every
// parameter's int64 step count.
// Under train.lora `trained` are the adapters and `frozen` the base's bytes, which every
// rank keeps whole (not in the buckets, never sharded); else `trained` is every parameter.
// `in_flight` gets the device's transient gradient buckets where the gradients are kept
// elsewhere (MemoryEstimate::in_flight).
// dist.elastic continue under ZeRO (train/elastic/share_mirror.h): rank r keeps a copy of rank
// r-1's share, its parameters and gradients flat (the owned segments), its optimizer state
// and EMA as the owner keeps them (an EMA in host memory there too). On several nodes the
// mirror is rank r-s's (mirror_stride), which this estimate does not know: the shares are
// the same, each on another rank, so only which rank holds the largest mirror may differ.
void add_mirrors(const parallel::ShardPlan& plan, std::vector<RankState>& ranks) {
  const int world = static_cast<int>(ranks.size());
  for (int r = 0; r < world; ++r) {
    const int p = (r + world - 1) % world;
    const auto& theirs = ranks[static_cast<size_t>(p)];
    ranks[static_cast<size_t>(r)].mirror =
        2 * 4 * static_cast<double>(plan.owned_elements(p)) + theirs.optimizer + theirs.ema;
    ranks[static_cast<size_t>(r)].host_mirror = theirs.host_ema;
  }
}

// What the optimizer keeps per parameter besides AdamW's flat moments: the step count, and
// each kind's moments (Lion's one, AdamW8bit's codes, CAME's and Adafactor's factored
// statistics, Prodigy's and ScheduleFreeAdamW's state and their copies of the global numbers).
double state_of_parameter(const OptimizerOptions& o, const EightBitState& eight_bit, const torch::Tensor& p) {
  const auto s = p.sizes();
  const auto n = static_cast<double>(p.numel());
  double bytes = 8;  // the step count
  if (o.type == OptimizerOptions::Kind::Lion) bytes += 4 * n;  // one fp32 moment
  if (o.type == OptimizerOptions::Kind::Adafactor) {  // factored or whole second moment, beta1's first moment
    bytes += Adafactor::factored(s) ? 4 * (n / static_cast<double>(s.back()) + n / static_cast<double>(s[s.size() - 2]))
                                    : 4 * n;
    if (!o.betas.empty()) bytes += 4 * n;
  }
  if (o.type == OptimizerOptions::Kind::Prodigy) {  // d, d_max, the numerator and k; both moments; s and p0
    const double sliced = std::ceil(n / static_cast<double>(o.slice_p));
    bytes += 4 * 8 + 4 * n * (o.betas.at(0) > 0 ? 2 : 1) + 2 * 4 * sliced;
  }
  if (o.type == OptimizerOptions::Kind::ScheduleFreeAdamW) bytes += 3 * 8 + 2 * 4 * n;  // k, lr_max, the weight sum; z, v
  if (o.type == OptimizerOptions::Kind::AdamW8bit) {  // two moments: uint8 codes and an fp32 absmax per 256, or fp32
    const double blocks = std::ceil(n / static_cast<double>(AdamW8bit::kBlock));
    bytes += p.numel() >= o.min_8bit_size ? 2 * (n + 4 * blocks) : 8 * n;
  }
  if (!o.came()) return bytes;
  if (Came::factored(s)) {
    // The first moment (uint8 codes plus a min and a scale per block of rows when 8-bit,
    // else fp32); rows and columns of two fp32 statistics.
    const double chunks = std::ceil(static_cast<double>(s[0]) / static_cast<double>(o.block_size));
    bytes += eight_bit.applies(s) ? n + 8 * chunks : 4 * n;
    bytes += 4 * 2.0 * static_cast<double>(s[0] + s[1]);
  } else {
    bytes += 4 * 2 * n;  // first and second moments
  }
  return bytes;
}

std::vector<RankState> state_bytes(const MemoryEstimateOptions& cfg, const NamedParams& trained, double frozen, int world,
                                   double& in_flight) {
  std::vector<parallel::ParamInfo> infos;
  std::vector<int64_t> numels;
  std::vector<size_t> units;
  std::vector<torch::Tensor> params;
  for (const auto& [name, t] : trained) {
    infos.push_back({name, t.numel(), 4, static_cast<int>(torch::kFloat32)});
    numels.push_back(t.numel());
    units.push_back(parallel::gathering_unit(name));
    params.push_back(t);
  }
  const auto& opts = cfg.reducer;
  const auto buckets = parallel::compute_buckets_mb(infos, opts.bucket_cap_mb, opts.first_bucket_mb);
  const bool sharded = cfg.zero_stage >= 1 && world > 1;
  const auto plan = parallel::plan_shards(buckets, infos.size(), numels, sharded ? world : 1);
  double flat = 0, largest = 0;
  for (const auto& b : buckets) {
    flat += 4 * static_cast<double>(b.numel);
    largest = std::max(largest, 4 * static_cast<double>(b.numel));
  }
  // The reducer keeps only the reduced segments (ZeRO 2 on several processes), or streams
  // them to the host (train.offload_optimizer): each bucket lives on the device from its
  // first gradient until its reduction ends. train.deterministic keeps them all.
  // Accumulating over several micro-batches, every bucket stays on the device from the first
  // micro-batch's backward to the step's last, where it is reduced: the whole gradients then.
  const bool streamed = cfg.offload_optimizer && !cfg.deterministic;
  const bool kept_sharded = cfg.zero_stage >= 2 && sharded && !cfg.deterministic;
  const bool accumulating =
      cfg.micro_batch_size > 0 && cfg.global_batch_size > cfg.micro_batch_size * static_cast<int64_t>(world);
  in_flight = !(streamed || kept_sharded) ? 0 : accumulating ? flat : 2 * largest;
  const auto& o = cfg.optimizer;
  const EightBitState eight_bit = EightBitState::of(o);
  // On CUDA under autocast, a bf16/fp16 copy of each gathered segment, the rank's own too.
  const bool half = cfg.autocast;
  std::vector<RankState> out;
  for (int r = 0; r < world; ++r) {
    const int owner = sharded ? r : 0;
    const double owned = 4 * static_cast<double>(plan.owned_elements(owner));
    RankState st;
    st.rank = r;
    const bool stage3 = cfg.zero_stage >= 3 && sharded;
    st.weights = (stage3 ? owned : flat) + frozen;  // stage 3: each owned segment its own tensor
    st.gathered = stage3 ? (half ? 2 : 4) * static_cast<double>(parallel::largest_gather(plan, buckets, units, owner, half)) : 0;
    st.gradients = streamed ? 0 : kept_sharded ? owned : flat;
    if (o.type == OptimizerOptions::Kind::AdamW) st.optimizer = 2 * owned;  // two flat moments
    for (size_t k = 0; k < params.size(); ++k) {
      if (plan.owner[k] != owner) continue;
      st.optimizer += state_of_parameter(o, eight_bit, params[k]);
      if (cfg.ema) st.ema += 4 * static_cast<double>(params[k].numel());
    }
    if (cfg.offload_optimizer) {  // fp32 masters, their gradients (the streamed ones), per owned segment; the state
      st.host_weights = owned;
      st.host_gradients = owned;
      st.host_optimizer = st.optimizer;
      st.optimizer = 0;
    }
    if (cfg.ema_on_host) std::swap(st.host_ema, st.ema);
    out.push_back(st);
  }
  if (cfg.mirror && sharded) add_mirrors(plan, out);
  return out;
}

// train.working_weights under CUDA autocast: every rank's half copies (2 bytes) of the
// weights `trains` names, none under ZeRO 3 on several ranks (its gathers are half already).
void add_working_copies(const MemoryEstimateOptions& cfg, torch::nn::Module& meta,
                        const std::function<bool(const std::string&)>& trains, std::vector<RankState>& ranks) {
  if (!cfg.autocast || !cfg.working_weights || (cfg.zero_stage >= 3 && ranks.size() > 1)) return;
  const double bytes = 2 * static_cast<double>(model::working_elements(meta, trains));
  for (auto& r : ranks) r.working = bytes;
}

// train.offload_blocks: `blocks` swapped, `host` bytes of them in host memory, the largest
// block `largest`: on the device at once, two with gradient checkpointing (the one computing,
// the one copied ahead), else all; copied in twice per micro-batch (forward and backward).
void count_swapping(const MemoryEstimateOptions& cfg, size_t blocks, double host, double largest, MemoryEstimate& e) {
  e.swapped_blocks = static_cast<int64_t>(blocks);
  e.swapped_in = cfg.grad_checkpointing ? std::min<double>(2, static_cast<double>(blocks)) * largest : host;
  e.swap_copies = 2 * host;
}

// train.offload_blocks on the meta model with its base frozen and stored: the swapped blocks'
// frozen bytes leave the device for the host; `e` gets what is on the device at once and
// copied per micro-batch. Returns the bytes that left.
double swap_blocks(const MemoryEstimateOptions& cfg, model::SanaMSImpl& meta, MemoryEstimate& e) {
  const auto ids = model::swapped_block_ids(cfg.offload_blocks, cfg.spec.depth);
  const auto blocks = meta.blocks->children();
  double host = 0, largest = 0;
  for (const auto k : ids) {
    double bytes = 0;
    // A frozen base's block: every parameter (LoRA's adapters and a ControlNet's control
    // blocks are not the base blocks').
    for (const auto& p : blocks[static_cast<size_t>(k)]->parameters()) bytes += static_cast<double>(p.numel() * p.element_size());
    host += bytes;
    largest = std::max(largest, bytes);
  }
  count_swapping(cfg, ids.size(), host, largest, e);
  return host;
}

// train.offload_blocks in a full fine-tune: the swapped blocks' buckets (each block owns
// whole ones, parallel/bucket_assignment.h) leave the device for the host, on every rank
// (ZeRO 1 and 2 keep every weight whole); `e` gets what is on the device at once and copied
// per micro-batch. Returns the bytes that left.
double swap_trained_blocks(const MemoryEstimateOptions& cfg, const NamedParams& trained, MemoryEstimate& e) {
  const auto ids = model::swapped_block_ids(cfg.offload_blocks, cfg.spec.depth);
  if (ids.empty()) return 0;
  std::vector<parallel::ParamInfo> infos;
  for (const auto& [name, t] : trained) infos.push_back({name, t.numel(), 4, static_cast<int>(torch::kFloat32)});
  const auto buckets = parallel::compute_buckets_mb(infos, cfg.reducer.bucket_cap_mb, cfg.reducer.first_bucket_mb);
  std::map<std::string, double> per_block;
  for (const auto k : ids) per_block[fmt::format("blocks.{}", k)] = 0;
  double host = 0, largest = 0;
  for (const auto& b : buckets) {
    const auto it = per_block.find(parallel::module_unit(infos[b.params.front()].name));
    if (it == per_block.end()) continue;
    it->second += 4 * static_cast<double>(b.numel);
    host += 4 * static_cast<double>(b.numel);
  }
  for (const auto& [unit, bytes] : per_block) largest = std::max(largest, bytes);
  count_swapping(cfg, ids.size(), host, largest, e);
  return host;
}

// The state every rank keeps (what trains, the frozen base, their gradients, optimizer
// state and EMA), counted on the model built on the meta device; `e` gets the largest rank's.
void estimate_state(const MemoryEstimateOptions& cfg, int world_size, MemoryEstimate& e) {
  const auto& spec = cfg.spec;
  model::SanaMS meta(spec, model::BuildOptions{torch::kFloat32, /*meta=*/true, 0});
  e.parameters = meta->parameter_count();
  e.optimizer_name = optimizer_name(cfg.optimizer.type);
  if (cfg.lora) {  // the adapters train; the base is frozen, its layers stored in frozen_dtype
    for (auto& p : meta->parameters()) p.requires_grad_(false);
    const auto stored = model::store_frozen_layers(*meta, cfg.frozen_dtype, [](const std::string&) { return true; });
    double base = 0;
    for (const auto& p : meta->parameters()) base += static_cast<double>(p.numel() * p.element_size());
    e.converted = static_cast<double>(stored.transient);
    e.frozen_dtype = cfg.frozen_dtype;
    const double swapped = swap_blocks(cfg, *meta, e);
    const model::Lora lora(*meta, *cfg.lora, "");
    e.trainable = lora.parameter_count();
    e.ranks = state_bytes(cfg, lora.parameters(), base - swapped, world_size, e.in_flight);
    for (auto& r : e.ranks) r.host_blocks = swapped;
    e.trained = "adapters";
    e.frozen = e.parameters;
  } else if (spec.control_blocks > 0) {  // the control blocks train; the base is frozen
    const model::ControlNetState control(*meta, "");
    e.trainable = control.parameter_count();
    // The base's layers in frozen_dtype (train.frozen_base_dtype), the control blocks fp32.
    const auto stored = model::store_frozen_layers(*meta, cfg.frozen_dtype, [](const std::string& layer) {
      return !model::is_control_parameter(layer);
    });
    double base = 0;
    for (const auto& [name, p] : model::base_parameters(*meta)) base += static_cast<double>(p.numel() * p.element_size());
    e.converted = static_cast<double>(stored.transient);
    e.frozen_dtype = cfg.frozen_dtype;
    const double swapped = swap_blocks(cfg, *meta, e);
    e.ranks = state_bytes(cfg, control.parameters(), base - swapped, world_size, e.in_flight);
    for (auto& r : e.ranks) r.host_blocks = swapped;
    add_working_copies(cfg, *meta, [](const std::string& layer) { return model::is_control_parameter(layer); }, e.ranks);
    e.trained = "control blocks";
    e.frozen = e.parameters - e.trainable;
  } else {
    NamedParams all;
    for (const auto& item : meta->named_parameters()) all.emplace_back(item.key(), item.value());
    e.trainable = e.parameters;
    e.ranks = state_bytes(cfg, all, 0, world_size, e.in_flight);
    const double swapped = swap_trained_blocks(cfg, all, e);
    if (e.swapped_blocks > 0) {  // no working copies then: they would stay on the device
      for (auto& r : e.ranks) {
        r.weights -= swapped;
        r.host_blocks = swapped;
      }
    } else {
      add_working_copies(cfg, *meta, [](const std::string&) { return true; }, e.ranks);
    }
  }
  const auto most = *std::max_element(e.ranks.begin(), e.ranks.end(), [](const RankState& a, const RankState& b) {
    return a.weights + a.gradients + a.optimizer + a.ema + a.gathered + a.working + a.mirror <
           b.weights + b.gradients + b.optimizer + b.ema + b.gathered + b.working + b.mirror;
  });
  e.weights = most.weights;
  e.gradients = most.gradients;
  e.optimizer = most.optimizer;
  e.ema = most.ema;
  e.gathered = most.gathered;
  e.working = most.working;
  e.host_weights = most.host_weights;
  e.host_gradients = most.host_gradients;
  e.host_optimizer = most.host_optimizer;
  e.host_ema = most.host_ema;
  e.mirror = most.mirror;
  e.host_mirror = most.host_mirror;
  e.host_blocks = most.host_blocks;
}

// SANA-Sprint's stage 2: the teacher on the meta device with its layers in frozen_dtype, and
// the heads' parameters by their shapes (model/ladd_heads.h: per head two C x C convolutions
// of kernel 1 and 9, two batch norms, a 1 x C output), trained whole on every rank with the
// run's optimizer kind (no ZeRO, no EMA).
void estimate_sprint_state(const MemoryEstimateOptions& cfg, MemoryEstimate& e) {
  const auto& sp = *cfg.sprint;
  model::SanaMS teacher(sp.teacher, model::BuildOptions{torch::kFloat32, /*meta=*/true, 0});
  for (auto& p : teacher->parameters()) p.requires_grad_(false);
  const auto stored = model::store_frozen_layers(*teacher, cfg.frozen_dtype, [](const std::string&) { return true; });
  e.teacher_parameters = teacher->parameter_count();
  for (const auto& p : teacher->parameters()) e.teacher += static_cast<double>(p.numel() * p.element_size());
  e.converted = std::max(e.converted, static_cast<double>(stored.transient));
  const int64_t C = sp.teacher.hidden;
  const auto meta = [](std::vector<int64_t> shape) { return torch::empty(shape, torch::device(torch::kMeta)); };
  NamedParams heads;
  for (int64_t i = 0; i < sp.heads; ++i) {
    const auto head = fmt::format("heads.{}.", i);
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"main.0.0.weight_orig", {C, C, 1}}, {"main.0.0.bias", {C}}, {"main.0.1.weight", {C}},
             {"main.0.1.bias", {C}}, {"main.1.fn.0.weight_orig", {C, C, 9}}, {"main.1.fn.0.bias", {C}},
             {"main.1.fn.1.weight", {C}}, {"main.1.fn.1.bias", {C}}, {"cls.weight_orig", {1, C, 1}}, {"cls.bias", {1}}}) {
      heads.emplace_back(head + name, meta(shape));
      e.heads_parameters += heads.back().second.numel();
    }
  }
  auto whole = cfg;
  whole.zero_stage = 0;
  whole.ema = whole.ema_on_host = whole.offload_optimizer = false;
  double in_flight = 0;
  const auto st = state_bytes(whole, heads, 0, 1, in_flight).front();
  e.heads = st.weights + st.gradients + st.optimizer;
}

}  // namespace

MemoryEstimate estimate_memory(const MemoryEstimateOptions& cfg, int world_size, bool activations) {
  MemoryEstimate e;
  const auto& spec = cfg.spec;
  e.world_size = world_size;
  e.zero_stage = cfg.zero_stage;
  estimate_state(cfg, world_size, e);
  if (cfg.sprint) estimate_sprint_state(cfg, e);
  const int64_t cell = spec.downsample * spec.patch;
  for (const auto& table : cfg.buckets) {
    for (const auto& b : table.buckets()) {
      const int64_t tokens = (b.height / cell) * (b.width / cell);
      if (tokens > e.tokens) {
        e.tokens = tokens;
        e.height = b.height;
        e.width = b.width;
      }
    }
  }
  e.micro_batch = cfg.micro_batch_size;
  e.checkpointing = cfg.grad_checkpointing;
  e.autocast = cfg.autocast;
  if (!activations) return e;  // the state only: activations 0
  log::info("memory estimate: measuring {}'s activations on the CPU at depth 1 and 2 (seconds for the largest presets)",
            spec.name);
  const auto [plain, kept] = measure(spec);
  e.activations = step_activations(plain, kept, spec, e.tokens, e.micro_batch, 0);
  e.activations_checkpointed = step_activations(plain, kept, spec, e.tokens, e.micro_batch, cfg.gc_step);
  if (cfg.sprint) add_stage2_graphs(*cfg.sprint, plain, kept, spec.depth, e);
  e.terms = {{"outside", plain.outside}, {"outside_per_token", plain.outside_per_token}, {"block", plain.block},
             {"block_per_token", plain.block_per_token}};
  e.terms_checkpointed = {{"outside", kept.outside}, {"outside_per_token", kept.outside_per_token},
                          {"block", kept.block}, {"block_per_token", kept.block_per_token}};
  return e;
}

double activations_at(const MemoryEstimate& e, const model::ModelSpec& spec, int64_t micro_batch, int64_t gc_step) {
  return step_activations(per_sample_of(e.terms), per_sample_of(e.terms_checkpointed), spec, e.tokens, micro_batch,
                          gc_step);
}

}  // namespace sana::train
