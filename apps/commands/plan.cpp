// `sana-train plan --config C [--world-size W --rank R --epoch E --json | --samples]`: the
// epoch plan (data/ builds it and its bucket histogram): the histogram and steps per
// epoch, with --json one rank's sample ids per step, or with --samples every sample's
// path and bucket (what another trainer needs to train the same samples at the same
// sizes: scripts/bench's Python peer reads it).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "command.h"
#include "sana/data/dataset.h"
#include "sana/data/distributed_sampler.h"
#include "sana/data/plan_coverage.h"
#include "sana/train/options/core_options.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::app {

namespace {

struct PlanOptions {
  int world_size = 1;
  int rank = 0;
  int64_t epoch = 0;
  bool json = false;
  bool samples = false;
};

void print_human(const data::Dataset& ds, const data::EpochPlan& plan, const config::Config& cfg,
                 const PlanOptions& o) {
  const auto& st = plan.stats();
  const int64_t g = cfg.train.global_batch_size, m = cfg.train.micro_batch_size;
  const auto [first, last] = data::rank_share(g, o.rank, o.world_size);
  const std::string per_rank =
      cfg.train.batch_tokens > 0
          ? "a share of each bucket's global batch (the histogram below lists them)"
      : cfg.train.micro_batch_auto
          ? fmt::format("{} samples per step in micro-batches of the size train.micro_batch_size auto takes on the "
                        "device (sana-train model --device-memory GIB shows it)", last - first)
          : fmt::format("{} samples per step in {} micro-batch{} of at most {}", last - first,
                        data::micro_batches(last - first, m), data::micro_batches(last - first, m) == 1 ? "" : "es", m);
  const std::string whose = cfg.data.sampler == config::DataSampler::distributed
                                ? fmt::format("DistributedSampler's partition for world size {}", o.world_size)
                                : "every rank, any world size";
  std::cout << fmt::format(
      "plan: {} samples, {} buckets in use, {}, epoch {}, tail {}\n"
      "steps per epoch: {} ({}); dropped {}, padded {}\n"
      "rank {} of {}: {}\nfingerprint {}\n\n",
      st.num_samples,
      std::count_if(st.samples_per_bucket.begin(), st.samples_per_bucket.end(), [](int64_t c) { return c > 0; }),
      ds.batch_spec().describe(), plan.epoch(), config::name_of(cfg.data.tail), plan.steps(), whose, st.dropped,
      st.padded, o.rank, o.world_size, per_rank, plan.fingerprint());
  std::cout << data::bucket_histogram(ds, plan);
}

void print_json(const data::EpochPlan& plan, const config::Config& cfg, const PlanOptions& o,
                const std::string& dataset_fingerprint) {
  // Written by hand to stream: a plan of millions of samples is one long array.
  const auto& st = plan.stats();
  std::string out = fmt::format(
      "{{\"steps_per_epoch\": {}, \"num_samples\": {}, \"dropped\": {}, \"padded\": {}, "
      "\"global_batch_size\": {}, \"micro_batch_size\": {}, \"world_size\": {}, \"rank\": {}, "
      "\"epoch\": {}, \"fingerprint\": \"{}\", \"dataset\": \"{}\", \"steps\": [",
      plan.steps(), st.num_samples, st.dropped, st.padded, cfg.train.global_batch_size,
      cfg.train.micro_batch_auto ? std::string("\"auto\"") : std::to_string(cfg.train.micro_batch_size),
      o.world_size, o.rank, plan.epoch(), plan.fingerprint(), dataset_fingerprint);
  std::fwrite(out.data(), 1, out.size(), stdout);
  auto cursor = plan.cursor();
  data::StepBatch step;
  while (cursor.next(step)) {
    const auto [first, last] = data::rank_share(static_cast<int64_t>(step.ids.size()), o.rank, o.world_size);
    out = fmt::format("{}[{}]", step.step ? ", " : "",
                      fmt::join(step.ids.begin() + first, step.ids.begin() + last, ", "));
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fputs("]}\n", stdout);
}

// "id<TAB>path<TAB>height<TAB>width" per sample, in index order.
void print_samples(const data::Dataset& ds) {
  std::fputs("# id\tpath\theight\twidth (the sample's bucket, pixels)\n", stdout);
  for (int64_t i = 0; i < ds.members().total(); ++i) {
    const auto& b = ds.buckets().bucket(ds.bucket_of(static_cast<uint64_t>(i)));
    const auto line = fmt::format("{}\t{}\t{}\t{}\n", i, ds.index().text(static_cast<data::SampleId>(i)).path,
                                  b.height, b.width);
    std::fwrite(line.data(), 1, line.size(), stdout);
  }
}

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

class Plan : public ConfigSubcommand {
 public:
  explicit Plan(CLI::App& app)
      : ConfigSubcommand(app, "plan",
                         "the epoch plan: bucket histogram, steps per epoch, and with --json a rank's "
                         "sample ids per step") {
    cli_->add_option("--world-size", o_.world_size, "world size to slice the plan for");
    cli_->add_option("--rank", o_.rank, "the rank whose slices --json lists");
    cli_->add_option("--epoch", o_.epoch, "epoch number (from 0)");
    cli_->add_flag("--json", o_.json, "print JSON: steps_per_epoch, num_samples, steps, ...");
    cli_->add_flag("--samples", o_.samples, "print every sample's id, path and bucket (h, w) as TSV")
        ->excludes("--json");
  }
  // The batch must fit --world-size, not this process's world.
  config::ValidationContext validation(const dist::LaunchEnv& env) const override {
    if (o_.world_size < 1 || o_.rank < 0 || o_.rank >= o_.world_size) {
      throw UsageError(fmt::format("plan: --rank {} is not in [0, --world-size {})", o_.rank, o_.world_size));
    }
    auto ctx = ConfigSubcommand::validation(env);
    ctx.world_size = o_.world_size;
    return ctx;
  }
  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto spec = train::model_spec_for(cfg);
    const auto ds = data::Dataset::open(train::dataset_options_for(cfg), {}, spec.downsample * spec.patch);
    const auto opened = Clock::now();
    // micro_batch_size auto takes a divisor of the share under data.sampler distributed:
    // the plan checks only that the world size divides the global batch then.
    const auto plan =
        data::make_epoch_plan(ds, o_.epoch, o_.world_size, cfg.train.micro_batch_auto ? 1 : cfg.train.micro_batch_size);
    data::check_plan_coverage(ds, plan, "plan");
    const auto first_ids = plan.rank_slice(0, o_.rank, o_.world_size);
    const auto planned = Clock::now();
    if (o_.samples) {
      print_samples(ds);
    } else if (o_.json) {
      print_json(plan, cfg, o_, ds.fingerprint());
    } else {
      print_human(ds, plan, cfg, o_);
    }
    log::info("plan: dataset opened in {:.3f} s, the plan and rank {}'s {} ids of step 1 in {:.4f} s; memory {}",
              std::chrono::duration<double>(opened - start).count(), o_.rank, first_ids.size(),
              std::chrono::duration<double>(planned - opened).count(), memory_report());
    return 0;
  }

 private:
  PlanOptions o_;
};

}  // namespace

std::unique_ptr<ConfigCommand> plan_command(CLI::App& app) { return std::make_unique<Plan>(app); }

}  // namespace sana::app
