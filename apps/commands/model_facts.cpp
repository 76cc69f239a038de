// sana-train model's facts (commands/model_facts.h).
#include "model_facts.h"

#include <algorithm>

#include "sana/data/dataset.h"
#include "sana/model/ladd_heads.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/trainable/trainable.h"

namespace sana::app::model_facts {

std::string thousands(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

namespace {

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

// The fewest blocks (of a frozen base, or trained under train.offload_optimizer) train.offload_blocks must swap for `budget` to hold the
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

}  // namespace

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
  const bool swappable = !f.memory || !f.memory->trained.empty() ||
                         (cfg.train.offload_optimizer && cfg.train.zero_stage < 3);  // config checks' rule
  if (f.memory && activations && device_memory > 0 && swappable && !f.spec.trigflow) {
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

std::vector<int> gpus_that_fit(double bytes) {
  std::vector<int> out;
  for (int gb : {8, 12, 16, 24, 48, 80}) {
    if (bytes + kContextBytes <= gb * 1e9) out.push_back(gb);
  }
  return out;
}

}  // namespace sana::app::model_facts
