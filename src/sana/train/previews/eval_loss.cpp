#include "sana/train/previews/eval_loss.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <optional>

#include "sana/data/loader.h"
#include "sana/util/error.h"

namespace sana::train {

std::string EvalResult::line() const {
  std::string parts;
  for (const auto& [t, loss] : by_timestep) parts += fmt::format("{}t{} {:.4f}", parts.empty() ? "" : ", ", t, loss);
  return fmt::format("eval at step {}: loss {:.4f} over {} samples ({}) in {:.1f} s", global_step, loss, samples,
                     parts, seconds);
}

EvalLoss::EvalLoss(EvalOptions options, data::Dataset held_out, data::LoaderOptions loader, dist::Runtime& rt)
    : o_(std::move(options)), held_out_(std::move(held_out)), loader_(std::move(loader)), rt_(rt) {
  count_ = static_cast<int64_t>(held_out_.index().size());
  if (o_.max_samples > 0) count_ = std::min(count_, o_.max_samples);
  if (count_ == 0) throw UsageError("train.eval.data_dir holds no sample", "config error");
  loader_.random_flip = false;
  loader_.cache = nullptr;
  loader_.rank = 0;  // each rank's plan holds its own samples alone
  loader_.world_size = 1;
  loader_.micro_batch = 1;
  loader_.whole_micro_batches = false;
}

EvalResult EvalLoss::run(TrainStep& step, int64_t global_step) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = rt_.rank(), world = rt_.world_size();
  std::vector<data::SampleId> mine;
  std::vector<uint16_t> buckets;
  for (int64_t i = rank; i < count_; i += world) {
    mine.push_back(static_cast<data::SampleId>(i));
    buckets.push_back(held_out_.bucket_of(static_cast<uint64_t>(i)));
  }
  const auto plan = data::EpochPlan::from_batches(mine, buckets, 1, 0, {});
  data::Loader loader(held_out_, plan, loader_);
  nlohmann::json measured = nlohmann::json::object();
  while (auto batch = loader.next()) measured[std::to_string(batch->ids.at(0))] = step.eval_losses(*batch, o_.timesteps);
  // Every rank sums every sample's losses in sample order: the same result at any world size.
  std::map<int64_t, std::vector<double>> by_sample;
  for (const auto& text : rt_.all_gather("eval losses", measured.dump())) {
    const auto theirs = nlohmann::json::parse(text);
    for (const auto& [id, losses] : theirs.items()) by_sample[std::stoll(id)] = losses.get<std::vector<double>>();
  }
  EvalResult r;
  r.global_step = global_step;
  r.samples = static_cast<int64_t>(by_sample.size());
  std::vector<double> sums(o_.timesteps.size(), 0.0);
  for (const auto& [id, losses] : by_sample) {
    for (size_t j = 0; j < sums.size(); ++j) sums[j] += losses.at(j);
  }
  double all = 0;
  for (size_t j = 0; j < sums.size(); ++j) {
    r.by_timestep[o_.timesteps[j]] = sums[j] / static_cast<double>(r.samples);
    all += sums[j];
  }
  r.loss = all / static_cast<double>(r.samples * static_cast<int64_t>(sums.size()));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace sana::train
