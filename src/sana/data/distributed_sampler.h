// torch.utils.data.DistributedSampler's partition, reproduced exactly (same permutation
// from torch's CPU generator seeded with seed + epoch, same padding by wrap-around or
// drop_last truncation, same stride by rank): data.sampler=distributed for users who
// need parity with a Python run on single-resolution data. Unlike the epoch plan it
// depends on the world size, as torch's does.
#pragma once

#include <cstdint>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/data/epoch_plan.h"

namespace sana::data {

std::vector<int64_t> distributed_sampler_indices(int64_t dataset_size, int world_size, int rank,
                                                 uint64_t seed, int64_t epoch, bool shuffle,
                                                 bool drop_last);

// The epoch's plan for the dataset's sampler (data.sampler): the world-size-independent
// bucket plan, or DistributedSampler's partition for `world_size` laid out as global
// batches of the dataset's batch, each rank's share a whole number of `micro_batch`
// (train.micro_batch_size) samples; a partial last batch is dropped so shapes stay fixed.
// Throws a config-kind UsageError for a distributed sampler over several buckets.
EpochPlan make_epoch_plan(const Dataset& ds, int64_t epoch, int world_size, int64_t micro_batch);

}  // namespace sana::data
