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
#include "model_facts.h"
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

using namespace model_facts;
using train::kContextBytes;

namespace {

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

// Below the device's figures: what block swapping copies, and the host memory for the state.
template <class Row>
void print_host_memory(const train::MemoryEstimate& m, const Row& row) {
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
      : m.trained.empty() ? (m.swapped_blocks > 0 ? "weights (fp32, the blocks not swapped)" : "weights (fp32)")
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
  print_host_memory(m, row);
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
