// torch.utils.data.DistributedSampler's partition, reproduced exactly (same permutation
// from torch's CPU generator seeded with seed + epoch, same padding by wrap-around or
// drop_last truncation, same stride by rank): data.sampler=distributed for users who
// need parity with a Python run on single-resolution data. Unlike the epoch plan it
// depends on the world size, as torch's does.
#pragma once

#include <cstdint>
#include <vector>

#include "sana/config/config.h"
#include "sana/data/dataset.h"
#include "sana/data/epoch_plan.h"

namespace sana::data {

std::vector<int64_t> distributed_sampler_indices(int64_t dataset_size, int world_size, int rank,
                                                 uint64_t seed, int64_t epoch, bool shuffle,
                                                 bool drop_last);

// The epoch's plan for data.sampler: the world-size-independent bucket plan, or
// DistributedSampler's partition for `world_size` laid out as global batches (each rank's
// list cut into its micro-batches; a partial last batch is dropped so shapes stay fixed).
// Throws a config-kind UsageError for a distributed sampler over several buckets.
EpochPlan make_epoch_plan(const Dataset& ds, const config::Config& cfg, int64_t epoch,
                          int world_size);

}  // namespace sana::data
