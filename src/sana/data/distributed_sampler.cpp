#include "sana/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>

#include "sana/util/error.h"

namespace sana::data {

std::vector<int64_t> distributed_sampler_indices(int64_t n, int world_size, int rank,
                                                 uint64_t seed, int64_t epoch, bool shuffle,
                                                 bool drop_last) {
  // num_samples and total_size as torch computes them.
  const int64_t w = world_size;
  const int64_t num_samples =
      drop_last && n % w != 0 ? (n - w + w - 1) / w : (n + w - 1) / w;
  const int64_t total = num_samples * w;
  std::vector<int64_t> indices(static_cast<size_t>(n));
  if (shuffle) {
    auto gen = at::detail::createCPUGenerator(seed + static_cast<uint64_t>(epoch));
    const auto perm = torch::randperm(n, gen, torch::kLong);
    std::copy_n(perm.data_ptr<int64_t>(), n, indices.begin());
  } else {
    for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  }
  if (!drop_last) {
    const auto original = indices;
    while (static_cast<int64_t>(indices.size()) < total) {
      const int64_t need = total - static_cast<int64_t>(indices.size());
      const int64_t take = std::min<int64_t>(need, static_cast<int64_t>(original.size()));
      indices.insert(indices.end(), original.begin(), original.begin() + take);
    }
  } else {
    indices.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> out;
  for (int64_t i = rank; i < total; i += w) out.push_back(indices[static_cast<size_t>(i)]);
  return out;
}

EpochPlan make_epoch_plan(const Dataset& ds, int64_t epoch, int world_size, int64_t micro_batch) {
  const DatasetOptions& o = ds.options();
  if (!o.distributed_sampler) return ds.plan(epoch);
  const auto& members = ds.members();
  int used = 0;
  uint16_t only = 0;
  for (int b = 0; b < members.buckets(); ++b) {
    if (members.count(b) == 0) continue;
    ++used;
    only = static_cast<uint16_t>(b);
  }
  if (used > 1) {
    throw UsageError(
        "data.sampler=distributed needs single-resolution data (one bucket), but the samples "
        "fall into several; set model.multi_scale: false or data.sampler: bucket",
        "config error");
  }
  const int64_t n = members.total();
  const int64_t g = o.batch.global_batch, m = micro_batch;
  if (g % (m * world_size) != 0) {
    throw UsageError(fmt::format("data.sampler=distributed gives every process train.global_batch_size / world size "
                                 "samples, as torch's DistributedSampler: {} is not train.micro_batch_size {} x "
                                 "world size {} x a whole number; change the batch sizes or use data.sampler: bucket",
                                 g, m, world_size),
                     "config error");
  }
  const int64_t share = g / world_size;
  std::vector<std::vector<int64_t>> per_rank;
  for (int r = 0; r < world_size; ++r) {
    per_rank.push_back(distributed_sampler_indices(n, world_size, r,
                                                   o.seed, epoch, true, o.tail == TailPolicy::drop));
  }
  // Each rank's list in order, cut into its consecutive shares of the global batches.
  const int64_t steps = static_cast<int64_t>(per_rank.front().size()) / share;
  std::vector<SampleId> ids(static_cast<size_t>(steps * g));
  for (int64_t j = 0; j < steps; ++j) {
    for (int r = 0; r < world_size; ++r) {
      for (int64_t k = 0; k < share; ++k) {
        ids[static_cast<size_t>(j * g + r * share + k)] =
            static_cast<SampleId>(per_rank[static_cast<size_t>(r)][static_cast<size_t>(j * share + k)]);
      }
    }
  }
  PlanStats st;
  st.num_samples = n;
  st.samples_per_bucket.assign(static_cast<size_t>(ds.buckets().size()), 0);
  st.steps_per_bucket.assign(static_cast<size_t>(ds.buckets().size()), 0);
  st.batch_per_bucket.assign(static_cast<size_t>(ds.buckets().size()), g);
  if (n > 0) {
    st.samples_per_bucket[only] = n;
    st.steps_per_bucket[only] = steps;
  }
  st.dropped = std::max<int64_t>(0, n - steps * g);
  st.padded = std::max<int64_t>(0, steps * g - n);
  return EpochPlan::from_batches(std::move(ids), std::vector<uint16_t>(static_cast<size_t>(steps), only), g, epoch,
                                 std::move(st));
}

}  // namespace sana::data
