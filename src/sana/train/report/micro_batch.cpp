#include "sana/train/report/micro_batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "sana/data/sample_cache.h"
#include "sana/train/report/device_peak.h"

namespace sana::train {

namespace {

// Image tokens per micro-batch from which the step's matrix products have rows enough to
// keep a GPU's tensor cores busy: more samples then buy little, recomputing blocks costs a
// third of a forward each.
constexpr int64_t kBusyTokens = 16384;

// /proc/meminfo's MemAvailable in bytes, 0 where it cannot be read.
double host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    double kib = 0;
    if (fields >> name >> kib && name == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

MicroBatchSuggestion suggest_micro_batch(const MemoryEstimate& e, const model::ModelSpec& spec, double budget,
                                         int64_t most) {
  MicroBatchSuggestion out;
  const double state = e.total() - e.activations_for_config();
  std::vector<int64_t> sizes;
  for (int64_t m = 1; m <= most; m *= 2) sizes.push_back(m);
  if (most > 0 && sizes.back() != most) sizes.push_back(most);
  // Least recomputation first: none, every second block, every block.
  for (const int64_t gc_step : {int64_t{0}, int64_t{2}, int64_t{1}}) {
    MicroBatchChoice best{gc_step, 0, 0};
    for (const int64_t m : sizes) {
      const double bytes = state + activations_at(e, spec, m, gc_step);
      if (bytes <= budget) best = {gc_step, m, bytes};
    }
    out.largest.push_back(best);
  }
  // The least recomputation whose micro-batch is big enough; else the largest micro-batch.
  const int64_t enough = std::min(most, std::max<int64_t>(1, (kBusyTokens + e.tokens - 1) / std::max<int64_t>(e.tokens, 1)));
  for (const auto& c : out.largest) {
    if (c.micro_batch >= enough) return out.pick = c, out;
  }
  for (const auto& c : out.largest) {
    if (c.micro_batch > out.pick.micro_batch) out.pick = c;
  }
  return out;
}

int64_t largest_share(int64_t global, int world) {
  const int64_t w = std::max(1, world);
  return std::max<int64_t>(1, (global + w - 1) / w);
}

MemoryEstimate estimate_at(MemoryEstimate e, const model::ModelSpec& spec, const MicroBatchChoice& choice) {
  e.micro_batch = choice.micro_batch;
  e.checkpointing = choice.gc_step > 0;
  e.activations = activations_at(e, spec, choice.micro_batch, 0);
  e.activations_checkpointed = activations_at(e, spec, choice.micro_batch, std::max<int64_t>(choice.gc_step, 1));
  return e;
}

MemoryBudget memory_budget(double gib, int cuda_index, int processes_on_host) {
  if (gib > 0) return {gib * (1 << 30), fmt::format("train.micro_batch_memory_gib {}", gib)};
  if (cuda_index >= 0) {
    return {static_cast<double>(cuda_device_memory(cuda_index)),
            fmt::format("GPU {} ({})", cuda_index, cuda_device_name(cuda_index))};
  }
  const int n = std::max(1, processes_on_host);
  const double available = host_available_bytes();
  return {available / n, fmt::format("this host's available memory ({}){}", data::size_text(static_cast<uint64_t>(available)),
                                     n == 1 ? std::string() : fmt::format(" over its {} processes", n))};
}

std::string checkpointing_name(int64_t gc_step) {
  if (gc_step == 0) return "train.grad_checkpointing false";
  if (gc_step == 1) return "train.grad_checkpointing true (every block)";
  return fmt::format("train.grad_checkpointing true, train.gc_step {}", gc_step);
}

}  // namespace sana::train
