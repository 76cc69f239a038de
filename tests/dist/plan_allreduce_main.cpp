// A multi-process check of the epoch plan with the real loader and a real all-reduce per
// step (seed 000: ranks finishing an epoch at different steps and hanging). Each rank
// iterates three epochs of its slices; per step the ranks all-reduce the sum of the
// sample ids they decoded, which must equal the sum over the global batch of the plan.
//   plan_allreduce DATA_SOURCE WORK_DIR [MAX_BAD_FRACTION]   (under a launcher)
#include <fmt/format.h>

#include <iostream>

#include "sana/config/loader.h"
#include "sana/data/loader.h"
#include "sana/distributed/runtime.h"
#include "sana/train/options/core_options.h"
#include "sana/train/input/data_guards.h"

int run(int argc, char** argv) {
  sana::config::Config cfg;
  cfg.data.data_dir = {argv[1]};
  cfg.work_dir = argv[2];
  cfg.data.image_size = cfg.model.image_size = 32;
  cfg.data.aspect_ratio_type = "generated";
  cfg.data.bucket_step = 8;
  cfg.data.multi_scale_sizes = {64};
  cfg.train.global_batch_size = 8;
  cfg.train.micro_batch_size = 2;
  cfg.dist.timeout_s = 60;
  cfg.data.max_bad_fraction = argc > 3 ? std::atof(argv[3]) : 1.0;
  const auto env = sana::dist::detect_launch_env();
  auto rt = sana::dist::Runtime::start(env, sana::train::runtime_options_for(cfg, sana::train::TestHooks::from_environment()),
                                       {SANA_VERSION, sana::config::config_fingerprint(cfg)});
  const auto ds = sana::data::Dataset::open(sana::train::dataset_options_for(cfg));
  rt->agree("dataset", ds.fingerprint());
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto plan = ds.plan(epoch);
    sana::train::agree_on_epoch_plan(*rt, plan);
    sana::data::LoaderOptions o;
    o.rank = rt->rank();
    o.world_size = rt->world_size();
    o.micro_batch = cfg.train.micro_batch_size;
    o.workers = 2;
    o.seed = 1;
    sana::data::Loader loader(ds, plan, o);
    sana::train::BadSampleGuard guard(cfg.data.max_bad_fraction);
    for (int64_t s = 0; s < plan.steps(); ++s) {
      double sum = 0;
      int64_t count = 1;
      for (int64_t t = 0; t < count; ++t) {
        auto b = loader.next();
        if (!b || b->step != s) throw std::runtime_error("the loader left the plan");
        count = b->micro_count;
        for (auto id : b->ids) sum += id;
        guard.add(*b);
      }
      try {
        guard.check(*rt);
      } catch (const sana::train::TooManyBadSamples& e) {
        // Said before the loader and runtime wind down: once the first rank exits, the
        // launcher stops the others, and a message printed after unwinding could be lost.
        std::cout << "stopped: " << e.what() << std::endl;
        return 1;
      }
      const double total = rt->all_reduce_sum(sum);
      double expected = 0;
      for (auto id : plan.batch(s).ids) expected += id;
      if (total != expected) {
        throw std::runtime_error(fmt::format("step {}: all-reduced {} != planned {}", s, total, expected));
      }
    }
    if (loader.next()) throw std::runtime_error("the loader outlived the plan");
    steps += plan.steps();
  }
  rt->finish();
  std::cout << fmt::format("rank {}: 3 epochs, {} steps, every all-reduce matched the plan\n",
                           rt->rank(), steps);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  return run(argc, argv);
}
