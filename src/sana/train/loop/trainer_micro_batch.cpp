// train.micro_batch_size auto: the trainer's config with the micro-batch and checkpointing
// the memory estimate suggests (train/loop/trainer.h's with_micro_batch_chosen).
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "sana/data/sample_cache.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/report/micro_batch.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/loop/trainer.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

std::string gib(double bytes) { return data::size_text(static_cast<uint64_t>(std::max(0.0, bytes))); }

// data.sampler distributed gives every rank global / world samples, cut into equal
// micro-batches: the largest divisor of the share up to `m`.
int64_t dividing(int64_t share, int64_t m) {
  while (m > 1 && share % m != 0) --m;
  return m;
}

// Every rank's budget and where it comes from (for the log): the least, which decides.
std::pair<double, std::string> least_budget(const config::Config& cfg, dist::Runtime& rt) {
  const torch::Device device = rt.device();
  const MemoryBudget mine = memory_budget(cfg.train.micro_batch_memory_gib, device.is_cuda() ? device.index() : -1,
                                          rt.env().local_world_size);
  const auto budgets = rt.all_gather("micro_batch_size auto: memory budget", fmt::format("{} {}", mine.bytes, mine.source));
  const auto bytes_of = [&](int r) { return std::stod(budgets[r].substr(0, budgets[r].find(' '))); };
  int least = 0;
  for (int r = 1; r < static_cast<int>(budgets.size()); ++r) {
    if (bytes_of(r) < bytes_of(least)) least = r;
  }
  std::string where = budgets[least].substr(budgets[least].find(' ') + 1);
  if (rt.world_size() > 1) where += fmt::format(", rank {}'s, the least of the {} ranks'", least, rt.world_size());
  return {bytes_of(least), where};
}

}  // namespace

config::Config with_micro_batch_chosen(const config::Config& cfg, dist::Runtime& rt) {
  if (!cfg.train.micro_batch_auto) return cfg;
  const auto spec = model_spec_for(cfg);
  if (spec.trigflow) {
    throw UsageError(fmt::format("train.micro_batch_size: auto is not for SANA-Sprint's stage 2 ({}): its memory "
                                 "holds several graphs at once, which the suggestion does not model",
                                 spec.name),
                     "config error");
  }
  const auto [budget_all, where] = least_budget(cfg, rt);
  // The frozen encoders this run loads on the device, counted from their config.json.
  const auto encoders = static_cast<double>(total_bytes(
      encoder_weights(encoder_options_for(cfg), rt.device().is_cuda(), EncoderUse::training, spec.conditioning)));
  const double budget = budget_all - kContextBytes - encoders;
  const int64_t share = largest_share(cfg.train.global_batch_size, rt.world_size());
  std::string decision;
  if (rt.rank() == 0) {
    const auto e = estimate_memory(memory_estimate_options_for(cfg), rt.world_size(), /*activations=*/true);
    const auto s = suggest_micro_batch(e, spec, budget, share);
    // Even one sample with every block checkpointed, for the message when nothing fits.
    const double smallest = e.total() - e.activations_for_config() + activations_at(e, spec, 1, 1);
    decision = fmt::format("{} {} {} {}", s.pick.micro_batch, s.pick.gc_step, s.pick.bytes, smallest);
  }
  std::istringstream in(rt.broadcast_string(decision));
  MicroBatchChoice pick;
  double smallest = 0;
  in >> pick.micro_batch >> pick.gc_step >> pick.bytes >> smallest;
  if (pick.micro_batch == 0) {
    throw UsageError(fmt::format("train.micro_batch_size: auto finds no micro-batch that fits: {} ({}) less {} "
                                 "for the CUDA context leaves {}, and one sample with every block checkpointed "
                                 "needs {}; give the run more memory (train.micro_batch_memory_gib), split its state "
                                 "(train.zero_stage over more processes, train.offload_optimizer) or train smaller "
                                 "buckets{}",
                                 gib(budget_all), where, gib(kContextBytes), gib(budget), gib(smallest),
                                 encoders > 0 ? fmt::format(" (the frozen encoders' {} are off the budget too: "
                                                            "precomputed features, sana-train prepare-features, free it)",
                                                            gib(encoders))
                                              : ""),
                     "config error");
  }
  config::Config out = cfg;
  auto& t = out.train;
  t.micro_batch_auto = false;
  t.micro_batch_size = pick.micro_batch;
  if (cfg.data.sampler == config::DataSampler::distributed) t.micro_batch_size = dividing(share, pick.micro_batch);
  t.grad_checkpointing = pick.gc_step > 0;
  t.gc_step = std::max<int64_t>(pick.gc_step, 1);
  log::info("train.micro_batch_size auto: {} with {}: the run's state and activations need {} of {}, that is {} "
            "({}) less {} for the CUDA context{} (activations at fp32, an upper bound under autocast; sana-train model "
            "--device-memory GIB lists the choices){}",
            t.micro_batch_size, checkpointing_name(pick.gc_step), gib(pick.bytes), gib(budget), gib(budget_all),
            where, gib(kContextBytes), encoders > 0 ? fmt::format(" and {} for the frozen encoders", gib(encoders)) : "",
            t.micro_batch_size == pick.micro_batch
                ? ""
                : fmt::format("; {} divides data.sampler distributed's {} samples per process, {} does not",
                              t.micro_batch_size, share, pick.micro_batch));
  return out;
}

}  // namespace sana::train
