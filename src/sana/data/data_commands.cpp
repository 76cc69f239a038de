#include "sana/data/data_commands.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>

#include "sana/data/dataset.h"
#include "sana/data/distributed_sampler.h"
#include "sana/data/index_builder.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::data {

int run_index_command(const IndexCommand& cmd) {
  IndexBuildOptions opts;
  opts.threads = cmd.threads;
  const auto r = build_index(cmd.inputs, cmd.output, opts);
  std::cout << fmt::format(
      "index: {} samples -> {} ({} bytes, {:.1f} bytes/sample) in {:.2f} s; {} sizes read from "
      "image headers, {} unreadable; fingerprint {}\n",
      r.rows, cmd.output, r.bytes, r.rows ? static_cast<double>(r.bytes) / r.rows : 0.0, r.seconds,
      r.sizes_read, r.unreadable, r.fingerprint);
  return kExitOk;
}

namespace {

void print_human(const Dataset& ds, const EpochPlan& plan, const config::Config& cfg,
                 const PlanCommand& cmd) {
  const auto& st = plan.stats();
  std::cout << fmt::format(
      "plan: {} samples, {} buckets in use, global batch {}, epoch {}, tail {}\n"
      "steps per epoch: {} (every rank, any world size); dropped {}, padded {}\n"
      "rank {} of {}: micro-batch {} x {} accumulation per step\nfingerprint {}\n\n",
      st.num_samples,
      std::count_if(st.samples_per_bucket.begin(), st.samples_per_bucket.end(),
                    [](int64_t c) { return c > 0; }),
      plan.global_batch(), plan.epoch(), cfg.data.tail, plan.steps(), st.dropped, st.padded,
      cmd.rank, cmd.world_size, cfg.train.micro_batch_size,
      cfg.train.global_batch_size / (cfg.train.micro_batch_size * cmd.world_size),
      plan.fingerprint());
  std::cout << fmt::format("{:>30} {:>9} {:>7}\n", "bucket (base: key -> h x w)", "samples",
                           "steps");
  for (int b = 0; b < ds.buckets().size(); ++b) {
    const auto i = static_cast<size_t>(b);
    if (st.samples_per_bucket[i] == 0) continue;
    std::cout << fmt::format("{:>30} {:>9} {:>7}\n", ds.buckets().describe(b),
                             st.samples_per_bucket[i], st.steps_per_bucket[i]);
  }
}

void print_json(const EpochPlan& plan, const config::Config& cfg, const PlanCommand& cmd,
                const std::string& dataset_fingerprint) {
  // Written by hand to stream: a plan of millions of samples is one long array.
  const auto& st = plan.stats();
  std::string out = fmt::format(
      "{{\"steps_per_epoch\": {}, \"num_samples\": {}, \"dropped\": {}, \"padded\": {}, "
      "\"global_batch_size\": {}, \"micro_batch_size\": {}, \"world_size\": {}, \"rank\": {}, "
      "\"epoch\": {}, \"fingerprint\": \"{}\", \"dataset\": \"{}\", \"steps\": [",
      plan.steps(), st.num_samples, st.dropped, st.padded, plan.global_batch(),
      cfg.train.micro_batch_size, cmd.world_size, cmd.rank, plan.epoch(), plan.fingerprint(),
      dataset_fingerprint);
  std::fwrite(out.data(), 1, out.size(), stdout);
  for (int64_t s = 0; s < plan.steps(); ++s) {
    const auto ids = plan.rank_slice(s, cmd.rank, cmd.world_size, cfg.train.micro_batch_size);
    out = fmt::format("{}[{}]", s ? ", " : "", fmt::join(ids, ", "));
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fputs("]}\n", stdout);
}

}  // namespace

namespace {
// This process's peak and current memory, from /proc (Linux): what the index costs.
std::string memory_report() {
  std::ifstream status("/proc/self/status");
  std::string line, out;
  while (std::getline(status, line)) {
    for (const char* key : {"VmHWM:", "RssAnon:", "RssFile:"}) {
      if (line.rfind(key, 0) == 0) {
        std::string v = line.substr(std::strlen(key));
        v.erase(0, v.find_first_not_of(" \t"));
        out += fmt::format("{}{} {}", out.empty() ? "" : ", ", key, v);
      }
    }
  }
  return out;
}
}  // namespace

int run_plan_command(const config::Config& cfg, const PlanCommand& cmd) {
  if (cmd.world_size < 1 || cmd.rank < 0 || cmd.rank >= cmd.world_size) {
    std::cerr << fmt::format("usage error: plan: --rank {} is not in [0, --world-size {})\n",
                             cmd.rank, cmd.world_size);
    return kExitUsage;
  }
  const Dataset ds = Dataset::open(cfg);
  EpochPlan plan;
  try {
    plan = make_epoch_plan(ds, cfg, cmd.epoch, cmd.world_size);
  } catch (const std::invalid_argument& e) {
    log::error("plan: {}", e.what());
    return kExitUsage;
  }
  if (plan.steps() == 0 && plan.stats().num_samples > 0) {
    log::error("plan: no step: every bucket holds fewer than train.global_batch_size {} samples "
               "and data.tail is {}; use data.tail=pad or a smaller global batch",
               cfg.train.global_batch_size, cfg.data.tail);
    return kExitUsage;
  }
  if (cmd.json) {
    print_json(plan, cfg, cmd, ds.fingerprint());
  } else {
    print_human(ds, plan, cfg, cmd);
  }
  log::info("plan: memory {}", memory_report());
  return kExitOk;
}

}  // namespace sana::data
