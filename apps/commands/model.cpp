// `sana-train model --config C [--json] [--world-size W]`: what a config's model is, without training it.
// The model is built on the meta device (no weights allocated, so the 1.6 B preset is
// instant); model/ counts its parameters per top-level module and its forward FLOPs per
// sample, shown for the square, tallest and widest bucket of each base size; and the
// memory one training process needs (train/report/memory_estimate.h: a few small forwards on the CPU).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "command.h"
#include "sana/data/dataset.h"
#include "sana/data/sample_cache.h"
#include "sana/model/ladd_heads.h"
#include "sana/model/sana_ms.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/report/device_peak.h"
#include "sana/train/report/memory_estimate.h"
#include "sana/train/report/micro_batch.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/trainable/trainable.h"

namespace sana::app {

namespace {

std::string thousands(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

struct BucketSize {
  int64_t base, height, width;
  model::Flops forward;  // per sample
  double train = 0;      // per sample: train::train_flops, what the run trains decides it
};

// What the command shows, gathered once for either format.
struct ModelFacts {
  model::ModelSpec spec;
  std::vector<std::pair<std::string, int64_t>> counts;
  int64_t total = 0;
  std::vector<std::vector<int64_t>> shapes;  // each parameter's, in the model's order
  std::string upstream_params;  // "" for our own presets
  std::vector<BucketSize> buckets;      // the showcase ones
  std::vector<BucketSize> all_buckets;  // every bucket of every table (JSON)
  std::optional<train::MemoryEstimate> memory;  // without --no-memory
  // For a device of `device_memory` bytes (--device-memory, else the GPU's): 2 GiB kept
  // for the CUDA context and the allocator's slack, the rest the budget.
  double device_memory = 0;
  std::optional<train::MicroBatchSuggestion> micro_batch;
  bool auto_micro_batch = false;  // train.micro_batch_size auto: `memory` is at the suggestion's pick
  // A frozen base on a device of `device_memory`: the fewest blocks train.offload_blocks must
  // swap for the config's total (with the frozen encoders) to fit, and that total; -1: none fits.
  std::optional<std::pair<int64_t, double>> swap;
  // SANA-Sprint stage 2 (a SanaMSCM preset): the frozen teacher and the discriminator heads.
  struct Sprint {
    std::string teacher;
    int64_t teacher_params = 0;
    std::vector<int64_t> blocks;
    int64_t heads_params = 0;
  };
  std::optional<Sprint> sprint;
  // The frozen encoders the training run loads on each process's device (none with
  // precomputed features), counted from their config.json; in bf16 unless dist.device cpu.
  std::vector<train::EncoderWeights> encoders;
  int64_t encoder_bytes() const { return train::total_bytes(encoders); }
};

// A SanaMSCM preset's stage-2 companions, counted without building them.
ModelFacts::Sprint sprint_facts(const config::Config& cfg) {
  ModelFacts::Sprint s;
  const auto teacher = train::teacher_spec_for(cfg);
  s.teacher = teacher.name;
  s.teacher_params = model::SanaMS(teacher, model::BuildOptions{torch::kFloat32, /*meta=*/true, 0})->parameter_count();
  s.blocks = train::head_blocks_for(cfg);
  s.heads_params = model::ladd_heads_parameters(teacher.hidden, static_cast<int64_t>(s.blocks.size()));
  return s;
}

using train::kContextBytes;

// The fewest blocks of a frozen base train.offload_blocks must swap for `budget` to hold the
// state and `measured`'s activations (-1: not even every block), and the total then.
std::pair<int64_t, double> fewest_swapped_blocks(const config::Config& cfg, int world_size,
                                                 const train::MemoryEstimate& measured, double budget) {
  auto o = train::memory_estimate_options_for(cfg);
  double total = 0;
  for (int64_t n = 0; n <= o.spec.depth; ++n) {
    o.offload_blocks = static_cast<double>(n);
    auto e = train::estimate_memory(o, world_size, /*activations=*/false);
    e.activations = measured.activations;
    e.activations_checkpointed = measured.activations_checkpointed;
    total = e.total();
    if (total <= budget) return {n, total};
  }
  return {-1, total};
}

ModelFacts facts_of(const config::Config& cfg, bool memory, int world_size, bool activations, double device_memory) {
  ModelFacts f{train::model_spec_for(cfg), {}, 0, {}, "", {}, {}, {}, {}, {}, false, {}, {}, {}};
  f.auto_micro_batch = cfg.train.micro_batch_auto;
  // As the estimate's autocast: the run is on CUDA unless dist.device says cpu.
  f.encoders = train::encoder_weights(train::encoder_options_for(cfg), cfg.dist.device != config::DeviceKind::cpu,
                                      train::EncoderUse::training, f.spec.conditioning);
  if (memory) f.memory = train::estimate_memory(train::memory_estimate_options_for(cfg), world_size, activations);
  // The suggestion scales the measured activations; stage 2's graphs are composed otherwise.
  // The frozen encoders on the device come off the budget, as the run's own choice does.
  if (f.memory && activations && device_memory > 0 && !f.spec.trigflow) {
    f.device_memory = device_memory;
    f.micro_batch = train::suggest_micro_batch(*f.memory, f.spec,
                                               device_memory - kContextBytes - static_cast<double>(f.encoder_bytes()),
                                               train::largest_share(cfg.train.global_batch_size, world_size));
    // train.micro_batch_size auto: the run is the one the suggestion picks.
    if (cfg.train.micro_batch_auto && f.micro_batch->pick.micro_batch > 0) {
      f.memory = train::estimate_at(*f.memory, f.spec, f.micro_batch->pick);
    }
  }
  if (f.memory && activations && device_memory > 0 && !f.memory->trained.empty() && !f.spec.trigflow) {
    f.swap = fewest_swapped_blocks(cfg, world_size, *f.memory,
                                   device_memory - kContextBytes - static_cast<double>(f.encoder_bytes()));
  }
  model::SanaMS net(f.spec, model::BuildOptions{torch::kFloat32, /*meta=*/true, 0});
  f.counts = net->parameter_counts();
  f.total = net->parameter_count();
  for (const auto& w : net->parameters()) f.shapes.push_back(w.sizes().vec());
  const auto& all = model::presets();
  const auto preset =
      std::find_if(all.begin(), all.end(), [&](const model::Preset& p) { return p.name == f.spec.name; });
  if (preset != all.end()) f.upstream_params = preset->upstream_params;
  if (f.spec.trigflow) f.sprint = sprint_facts(cfg);
  for (const auto& table : data::bucket_tables_for(train::bucket_options_for(cfg))) {
    const auto size = [&](const data::Bucket& b) {
      const auto forward = model::forward_flops(f.spec, b.height, b.width);
      return BucketSize{table.base(), b.height, b.width, forward, train::train_flops(config::lora_enabled(cfg.train), f.spec, forward)};
    };
    for (const auto& b : data::showcase_buckets(table)) f.buckets.push_back(size(b));
    for (const auto& b : table.buckets()) f.all_buckets.push_back(size(b));
  }
  return f;
}

// The GPU sizes (decimal GB, as sold) whose memory holds `bytes` plus 2 GiB for the CUDA
// context and the allocator's slack.
std::vector<int> gpus_that_fit(double bytes) {
  std::vector<int> out;
  for (int gb : {8, 12, 16, 24, 48, 80}) {
    if (bytes + kContextBytes <= gb * 1e9) out.push_back(gb);
  }
  return out;
}

// The memory estimate's JSON: every figure in bytes, the largest rank's and each rank's.
nlohmann::ordered_json memory_json(const train::MemoryEstimate& m) {
  auto ranks = nlohmann::json::array();
  for (const auto& r : m.ranks) {
    ranks.push_back({{"rank", r.rank}, {"weights", r.weights}, {"gradients", r.gradients}, {"optimizer", r.optimizer},
                     {"ema", r.ema}, {"gathered", r.gathered}, {"working", r.working}, {"host_weights", r.host_weights},
                     {"host_gradients", r.host_gradients}, {"host_optimizer", r.host_optimizer},
                     {"host_ema", r.host_ema}, {"mirror", r.mirror}, {"host_mirror", r.host_mirror},
                     {"host_blocks", r.host_blocks}});
  }
  return {{"world_size", m.world_size},
          {"trainable_parameters", m.trainable},
          {"zero_stage", m.zero_stage},
          {"ranks", ranks},
          {"bucket", {{"height", m.height}, {"width", m.width}, {"tokens", m.tokens}}},
          {"micro_batch", m.micro_batch},
          {"weights", m.weights},
          {"gradients", m.gradients},
          {"optimizer", m.optimizer},
          {"optimizer_type", m.optimizer_name},
          {"ema", m.ema},
          {"gathered", m.gathered},
          {"working", m.working},
          {"mirror", m.mirror},
          {"frozen_dtype", model::storage_dtype_name(m.frozen_dtype)},
          {"converted", m.converted},
          {"gradient_buckets_in_flight", m.in_flight},
          {"swapped_blocks", m.swapped_blocks},
          {"swapped_blocks_on_device", m.swapped_in},
          {"swap_copies_per_micro_batch", m.swap_copies},
          {"sprint_teacher", m.teacher},
          {"sprint_heads", m.heads},
          {"activations", m.activations},
          {"activations_grad_checkpointing", m.activations_checkpointed},
          {"activation_terms", m.terms},
          {"activation_terms_grad_checkpointing", m.terms_checkpointed},
          {"grad_checkpointing", m.checkpointing},
          {"activations_are_fp32_upper_bound_under_autocast", m.autocast},
          {"total_for_config", m.total()},
          {"fits_gpus_gb", gpus_that_fit(m.total())},
          {"host", {{"weights", m.host_weights},
                    {"gradients", m.host_gradients},
                    {"optimizer", m.host_optimizer},
                    {"ema", m.host_ema},
                    {"mirror", m.host_mirror},
                    {"blocks", m.host_blocks},
                    {"total", m.host_total()}}}};
}

void print_json(const ModelFacts& f) {
  const auto& spec = f.spec;
  nlohmann::ordered_json j;
  j["model"] = spec.name;
  j["spec"] = {{"hidden", spec.hidden},
               {"depth", spec.depth},
               {"linear_heads", spec.linear_heads()},
               {"linear_head_dim", spec.linear_head_dim},
               {"cross_heads", spec.cross_heads},
               {"patch", spec.patch},
               {"mlp_hidden", spec.mlp_hidden()},
               {"in_channels", spec.in_channels},
               {"downsample", spec.downsample},
               {"conditioning", model::conditioning_name(spec.conditioning)},
               {"condition_tokens", spec.cond_tokens()}};
  nlohmann::ordered_json p;
  for (const auto& [name, n] : f.counts) p[name] = n;
  p["total"] = f.total;
  j["parameters"] = p;
  j["parameter_shapes"] = f.shapes;  // the optimizer's tensors (scripts/perf/pieces.py)
  if (f.micro_batch) {
    const auto choice = [](const train::MicroBatchChoice& c) {
      return nlohmann::ordered_json{{"gc_step", c.gc_step}, {"micro_batch", c.micro_batch}, {"bytes", c.bytes}};
    };
    auto largest = nlohmann::ordered_json::array();
    for (const auto& c : f.micro_batch->largest) largest.push_back(choice(c));
    j["micro_batch_suggestion"] = {{"device_memory", f.device_memory},
                                   {"budget", f.device_memory - kContextBytes},
                                   {"largest", largest},
                                   {"pick", choice(f.micro_batch->pick)},
                                   {"taken", f.auto_micro_batch}};  // micro_batch_size auto: the estimate is the pick's
  }
  if (!f.upstream_params.empty()) j["upstream_parameters"] = f.upstream_params;
  if (f.sprint) {
    j["sprint"] = {{"teacher", f.sprint->teacher},
                   {"teacher_parameters", f.sprint->teacher_params},
                   {"head_block_ids", f.sprint->blocks},
                   {"heads_parameters", f.sprint->heads_params}};
  }
  const auto flops_of = [&](const std::vector<BucketSize>& buckets) {
    auto out = nlohmann::json::array();
    for (const auto& b : buckets) {
      out.push_back({{"base", b.base},
                     {"height", b.height},
                     {"width", b.width},
                     {"tokens", b.forward.tokens},
                     {"forward", b.forward.total},
                     {"train", b.train}});
    }
    return out;
  };
  j["flops"] = flops_of(f.buckets);
  j["flops_every_bucket"] = flops_of(f.all_buckets);
  auto encoders = nlohmann::json::array();
  for (const auto& e : f.encoders) {
    encoders.push_back({{"role", e.role}, {"what", e.what}, {"source", e.source}, {"parameters", e.parameters},
                        {"bytes", e.bytes}, {"dtype", e.dtype}, {"missing", e.missing}});
  }
  j["encoders"] = encoders;
  if (!f.memory) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  j["memory_per_process"] = memory_json(*f.memory);
  j["memory_per_process"]["encoders"] = f.encoder_bytes();
  j["memory_per_process"]["total_with_encoders"] = f.memory->total() + static_cast<double>(f.encoder_bytes());
  std::cout << j.dump(2) << "\n";
}


// The encoders' rows below the model's estimate, and the total with them.
void print_encoders(const ModelFacts& f) {
  if (f.encoders.empty()) {
    std::cout << "  frozen encoders on the device: none (no VAE or text encoder, or their features precomputed)\n";
    return;
  }
  for (const auto& e : f.encoders) {
    const std::string what = fmt::format("{} ({}{})", e.role, e.what, e.dtype.empty() ? "" : ", " + e.dtype);
    if (!e.missing.empty()) {
      std::cout << fmt::format("  {:<38} {:>10}  not counted: {}\n", what, "?", e.missing);
    } else {
      std::cout << fmt::format("  {:<38} {:>10}  {}{}\n", what, data::size_text(static_cast<uint64_t>(e.bytes)),
                               e.parameters >= 0 ? thousands(e.parameters) + " parameters, " : std::string("file size, "),
                               e.source);
    }
  }
  if (f.memory) {
    const double total = f.memory->total() + static_cast<double>(f.encoder_bytes());
    const auto fits = gpus_that_fit(total);
    std::cout << fmt::format("  {:<38} {:>10}  fits GPUs of {}\n", "total with the frozen encoders",
                             data::size_text(static_cast<uint64_t>(total)),
                             fits.empty() ? std::string("none of 8, 12, 16, 24, 48, 80 GB")
                                          : fmt::format("{} GB", fmt::join(fits, ", ")));
  }
  std::cout << "  (precomputed features, sana-train prepare-features, keep the encoders off the training run)\n";
}

void print_memory(const train::MemoryEstimate& m) {
  std::cout << fmt::format("\nmemory per process (estimate: micro-batch {} at the largest bucket {}x{}, {} tokens; "
                           "{} process{}, train.zero_stage {}{}):\n",
                           m.micro_batch, m.height, m.width, m.tokens, m.world_size, m.world_size == 1 ? "" : "es",
                           m.zero_stage, m.world_size > 1 ? ", the rank that keeps the most" : "");
  const auto row = [](const std::string& what, double bytes, const std::string& note = "") {
    std::cout << fmt::format("  {:<38} {:>10}{}\n", what, data::size_text(static_cast<uint64_t>(bytes)), note.empty() ? "" : "  " + note);
  };
  if (!m.trained.empty()) {
    std::cout << fmt::format("  {} trainable parameters (the {}; the base's {} frozen): gradients, optimizer state "
                             "and EMA are theirs alone\n",
                             thousands(m.trainable), m.trained, thousands(m.frozen));
  }
  const bool stored = m.frozen_dtype != model::StorageDtype::fp32;
  row(m.gathered > 0      ? "weights (fp32, this rank's share)"
      : m.trained.empty() ? "weights (fp32)"
      : stored            ? fmt::format("weights (base {}, {} fp32)", model::storage_dtype_name(m.frozen_dtype), m.trained)
                          : fmt::format("weights (fp32, base and {})", m.trained),
      m.weights);
  if (m.converted > 0) row("one base layer restored (transient)", m.converted);
  if (m.swapped_blocks > 0) {
    row("swapped blocks in use (transient)", m.swapped_in,
        fmt::format("<- train.offload_blocks: {} of them in host memory{}", m.swapped_blocks,
                    m.checkpointing ? ", 2 on the device at once" : "; all kept for the backward without checkpointing"));
  }
  const bool offloaded = m.host_optimizer > 0;
  row("gradients (fp32)", m.gradients, offloaded && m.gradients == 0 ? "<- streamed to host memory" : "");
  if (m.in_flight > 0) row("gradient buckets in flight (transient)", m.in_flight);
  row(fmt::format("optimizer state ({})", m.optimizer_name), m.optimizer, offloaded ? "<- in host memory" : "");
  if (m.ema > 0) row("EMA weights", m.ema);
  if (m.teacher > 0) {
    row(fmt::format("SANA-Sprint teacher ({}, frozen)", model::storage_dtype_name(m.frozen_dtype)), m.teacher,
        fmt::format("{} parameters", thousands(m.teacher_parameters)));
    row(fmt::format("discriminator heads (fp32, {})", m.optimizer_name), m.heads,
        fmt::format("{} parameters: weights, gradients, optimizer state", thousands(m.heads_parameters)));
  }
  if (m.gathered > 0) row("gathered parameters (ZeRO 3, at most)", m.gathered);
  if (m.working > 0) row("half working copies of the weights", m.working, "<- train.working_weights");
  if (m.mirror > 0) row("mirror of another rank's share", m.mirror, "<- dist.elastic continue: weights, gradients, optimizer state, EMA");
  if (m.teacher > 0) {
    std::cout << "  (activations below: stage 2's generator step, from the student's flow step: its sCM graph, with "
                 "train.train_largest_timestep its x0 graph too, and the teacher's up to its last head block at "
                 "once)\n";
  }
  row("activations", m.activations, m.checkpointing ? "" : "<- train.grad_checkpointing false");
  row("activations, gradient checkpointing", m.activations_checkpointed,
      m.checkpointing ? "<- train.grad_checkpointing true" : "");
  if (m.autocast) {
    std::cout << "  (fp32 activations: under the config's bf16/fp16 autocast most are half that; this is the upper "
                 "bound)\n";
  }
  row("total for this config", m.total(),
      "(the model's part; the frozen encoders below, and on a GPU the CUDA context and allocator slack, about "
      "1-2 GiB)");
  const auto fits = gpus_that_fit(m.total());
  std::cout << fmt::format("  fits GPUs of {} (with 2 GiB for the CUDA context{})\n",
                           fits.empty() ? std::string("none of 8, 12, 16, 24, 48, 80 GB") : fmt::format("{} GB", fmt::join(fits, ", ")),
                           m.world_size == 1 && m.zero_stage == 0 ? "; more processes with train.zero_stage split the state"
                                                                  : "");
  if (m.swapped_blocks > 0) {
    // An assumption, said as one: page-locked copies over PCIe 4.0 x16 run at about this.
    constexpr double kHostToDevice = 16e9;
    std::cout << fmt::format("  block swapping copies {} to the device per micro-batch (each swapped block for the "
                             "forward and again for the backward): about {:.0f} ms at an assumed {:.0f} GB/s "
                             "host-to-device, hidden where the copy of the next block overlaps the compute\n",
                             data::size_text(static_cast<uint64_t>(m.swap_copies)), 1e3 * m.swap_copies / kHostToDevice,
                             kHostToDevice / 1e9);
  }
  if (m.host_total() > 0) {
    std::cout << "host memory per process for the run's state (train.offload_optimizer, train.ema_device cpu, "
                 "train.offload_blocks; beside the loaded encoders and data):\n";
    if (m.host_blocks > 0) row("swapped blocks' weights (page-locked)", m.host_blocks);
    if (m.host_weights > 0) row("master weights (fp32)", m.host_weights);
    if (m.host_gradients > 0) row("master gradients (fp32)", m.host_gradients);
    if (m.host_optimizer > 0) row(fmt::format("optimizer state ({})", m.optimizer_name), m.host_optimizer);
    if (m.host_ema > 0) row("EMA weights", m.host_ema);
    if (m.host_mirror > 0) row("mirror of another rank's EMA", m.host_mirror);
    row("host total", m.host_total());
  }
}

void print_micro_batch(const ModelFacts& f) {
  const auto& s = *f.micro_batch;
  std::cout << fmt::format("\nmicro-batch for a device of {} ({} of it for the state and activations; 2 GiB kept for "
                           "the CUDA context; activations at fp32, an upper bound under autocast):\n",
                           data::size_text(static_cast<uint64_t>(f.device_memory)),
                           data::size_text(static_cast<uint64_t>(f.device_memory - kContextBytes)));
  for (const auto& c : s.largest) {
    std::cout << fmt::format("  {:<58} {}\n", train::checkpointing_name(c.gc_step),
                             c.micro_batch == 0 ? std::string("none fits")
                                                : fmt::format("up to {} ({})", c.micro_batch,
                                                              data::size_text(static_cast<uint64_t>(c.bytes))));
  }
  if (s.pick.micro_batch == 0) {
    std::cout << "  suggested: nothing fits" << (f.auto_micro_batch ? " (train.micro_batch_size auto will stop)" : "")
              << "; train.zero_stage over more processes, train.offload_optimizer, or a "
                 "smaller bucket\n";
  } else {
    std::cout << fmt::format("  suggested: train.micro_batch_size {} with {} (the least recomputation whose "
                             "micro-batch holds 16384 image tokens or the whole per-process batch, else the "
                             "largest micro-batch)\n",
                             s.pick.micro_batch, train::checkpointing_name(s.pick.gc_step));
  }
}

void print_text(const ModelFacts& f) {
  using model::Conditioning;
  const auto& spec = f.spec;
  std::cout << fmt::format(
      "{}: width {}, depth {}, {} linear-attention heads x {}, {} cross-attention heads, patch {}, "
      "GLUMBConv hidden {}\n",
      spec.name, spec.hidden, spec.depth, spec.linear_heads(), spec.linear_head_dim, spec.cross_heads, spec.patch,
      spec.mlp_hidden());
  std::cout << fmt::format(
      "input: {} channels ({}), conditioning: {}{}\n", spec.in_channels,
      spec.downsample == 1 ? "pixels" : fmt::format("latents, {} px per cell", spec.downsample),
      model::conditioning_name(spec.conditioning),
      spec.conditioning == Conditioning::caption
          ? fmt::format(" ({} tokens x {} features)", spec.caption_tokens, spec.caption_channels)
      : spec.conditioning == Conditioning::class_label ? fmt::format(" ({} classes + null)", spec.num_classes)
                                                       : "");
  std::cout << "\nparameters:\n";
  for (const auto& [name, n] : f.counts) std::cout << fmt::format("  {:<18} {:>15}\n", name, thousands(n));
  std::cout << fmt::format("  {:<18} {:>15}  ({:.3f} B)\n", "total", thousands(f.total),
                           static_cast<double>(f.total) / 1e9);
  if (!f.upstream_params.empty()) std::cout << fmt::format("  upstream reports   {}\n", f.upstream_params);
  if (f.sprint) {
    std::cout << fmt::format("SANA-Sprint stage 2 (docs/sprint.md): the teacher {} {} parameters (frozen); "
                             "discriminator heads on its blocks [{}] {} parameters (trained).\n",
                             f.sprint->teacher, thousands(f.sprint->teacher_params), fmt::join(f.sprint->blocks, ", "),
                             thousands(f.sprint->heads_params));
  }
  std::cout << "\nFLOPs per sample (2 x multiply-adds; train: the forward, the backward, and the weight gradients "
               "of what trains: 3 x forward for a whole model, less on a frozen base):\n";
  std::cout << fmt::format("  {:>5}  {:>11}  {:>7}  {:>14}  {:>14}\n", "base", "bucket", "tokens", "forward GFLOP",
                           "train GFLOP");
  for (const auto& b : f.buckets) {
    std::cout << fmt::format("  {:>5}  {:>11}  {:>7}  {:>14.2f}  {:>14.2f}\n", b.base,
                             fmt::format("{}x{}", b.height, b.width), b.forward.tokens, b.forward.total / 1e9,
                             b.train / 1e9);
  }
  if (f.memory) print_memory(*f.memory);
  if (f.memory || !f.encoders.empty()) print_encoders(f);
  if (f.micro_batch) print_micro_batch(f);
  if (f.swap) {
    const auto [n, total] = *f.swap;
    std::cout << fmt::format(
        "\nblock swapping for a device of {} (2 GiB kept for the CUDA context, the frozen encoders counted): {}\n",
        data::size_text(static_cast<uint64_t>(f.device_memory)),
        n < 0   ? fmt::format("even every block swapped needs {}", data::size_text(static_cast<uint64_t>(total)))
        : n == 0 ? fmt::format("none needed ({})", data::size_text(static_cast<uint64_t>(total)))
                 : fmt::format("train.offload_blocks: {} ({} for this config)", n,
                               data::size_text(static_cast<uint64_t>(total))));
  }
}

class Model : public ConfigSubcommand {
 public:
  explicit Model(CLI::App& app)
      : ConfigSubcommand(app, "model", "the config's model: parameters per module, FLOPs per sample for a few buckets, memory per process",
                         {/*required=*/true, /*data=*/false}) {
    cli_->add_flag("--json", json_, "print JSON");
    cli_->add_option("--world-size", world_size_, "processes the memory estimate is for (train.zero_stage splits "
                                                  "the state over them; default 1)")
        ->check(CLI::Range(1, 1 << 20));
    cli_->add_flag("--no-activations", no_activations_,
                   "the memory estimate without the activations (their measurement takes seconds): the state only");
    cli_->add_flag("--no-memory", no_memory_,
                   "skip the memory estimate (it builds the model at depth 1 and 2 on the CPU: seconds for 1.6B)");
    cli_->add_option("--device-memory,--gpu-memory", device_gib_,
                     "GiB of the device to suggest a micro-batch, gradient checkpointing and, for a frozen base, "
                     "train.offload_blocks for (default: GPU 0's, where there is one)")
        ->check(CLI::Range(1.0, 1e6));
  }
  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    // The flag, else train.micro_batch_memory_gib, else GPU 0's; under micro_batch_size auto
    // without a GPU, what the training takes there: this host's available memory.
    const double gib = device_gib_ > 0 ? device_gib_ : cfg.train.micro_batch_memory_gib;
    const int gpu = torch::cuda::is_available() ? 0 : -1;
    double device_memory = 0;
    if (gib > 0 || gpu >= 0 || cfg.train.micro_batch_auto) {
      device_memory = train::memory_budget(gib, gpu, world_size_).bytes;
    }
    const auto facts = facts_of(cfg, !no_memory_, world_size_, !no_activations_, device_memory);
    if (json_) {
      print_json(facts);
    } else {
      print_text(facts);
    }
    return 0;
  }

 private:
  bool json_ = false;
  bool no_memory_ = false;
  int world_size_ = 1;
  bool no_activations_ = false;
  double device_gib_ = 0;
};

}  // namespace

std::unique_ptr<ConfigCommand> model_command(CLI::App& app) { return std::make_unique<Model>(app); }

}  // namespace sana::app
