#include "sana/data/loader.h"

#include <fmt/format.h>

#include <chrono>

#include "sana/util/log.h"
#include "sana/util/random.h"

namespace sana::data {

namespace {
constexpr int kSubstituteAttempts = 16;
}

Loader::Loader(const Dataset& dataset, const EpochPlan& plan, LoaderOptions opts,
               int64_t first_step)
    : dataset_(dataset), plan_(plan), opts_(std::move(opts)) {
  const int64_t per_micro = opts_.micro_batch * opts_.world_size;
  if (per_micro <= 0 || plan.global_batch() % per_micro != 0) {
    throw LoaderError(fmt::format("global batch {} is not micro-batch {} x world size {} x a "
                                  "whole number",
                                  plan.global_batch(), opts_.micro_batch, opts_.world_size));
  }
  const int64_t accumulation = plan.global_batch() / per_micro;
  for (int64_t s = first_step; s < plan.steps(); ++s) {
    for (int64_t t = 0; t < accumulation; ++t) jobs_.push_back({s, t});
  }
  const int n = std::max(1, opts_.workers);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  room_.notify_all();
  ready_.notify_all();
  for (auto& t : threads_) t.join();
}

void Loader::work() {
  while (true) {
    size_t k = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      room_.wait(lock, [&] {
        return stopping_ || next_job_ >= jobs_.size() ||
               next_job_ < next_out_ + static_cast<size_t>(std::max(1, opts_.prefetch));
      });
      if (stopping_ || next_job_ >= jobs_.size()) return;
      k = next_job_++;
    }
    try {
      Batch b = decode_job(jobs_[k]);
      std::lock_guard<std::mutex> lock(mutex_);
      done_.emplace(k, std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    ready_.notify_all();
  }
}

std::optional<Batch> Loader::next() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (next_out_ >= jobs_.size()) return std::nullopt;
  const auto limit = std::chrono::duration<double>(opts_.wait_timeout_s);
  const bool arrived = ready_.wait_for(lock, limit, [&] {
    return error_ != nullptr || done_.count(next_out_) > 0;
  });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (error_) std::rethrow_exception(error_);
  if (!arrived) {
    throw LoaderError(fmt::format("no batch decoded within {} s (step {}): a worker is stuck, "
                                  "e.g. on a hung network file system",
                                  opts_.wait_timeout_s, jobs_[next_out_].step));
  }
  auto it = done_.find(next_out_);
  Batch b = std::move(it->second);
  done_.erase(it);
  ++next_out_;
  lock.unlock();
  room_.notify_all();
  return b;
}

Batch Loader::decode_job(const Job& job) {
  Batch b;
  b.step = job.step;
  b.micro_step = job.micro_step;
  b.bucket = plan_.bucket(job.step);
  b.ids = plan_.micro_batch(job.step, opts_.rank, opts_.world_size, opts_.micro_batch,
                            job.micro_step);
  const Bucket& bucket = dataset_.buckets().bucket(b.bucket);
  const int h = bucket.height, w = bucket.width;
  auto options = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(opts_.pin_memory);
  b.images = torch::empty({static_cast<int64_t>(b.ids.size()), 3, h, w}, options);
  float* out = b.images.data_ptr<float>();
  const auto& index = dataset_.index();
  for (size_t i = 0; i < b.ids.size(); ++i) {
    SampleId used = b.ids[i];
    if (!decode_sample(b.ids[i], b.bucket, plan_.epoch(), out + i * 3 * h * w, h, w, used)) {
      throw LoaderError(fmt::format(
          "sample {} and {} substitutes from its bucket ({}) could not be decoded: the data is "
          "mostly unreadable; run sana-train check-data",
          b.ids[i], kSubstituteAttempts, dataset_.buckets().describe(b.bucket)));
    }
    if (used != b.ids[i]) ++b.substituted;
    b.decoded_ids.push_back(used);
    b.labels.push_back(index.record(used).label);
    b.captions.emplace_back(index.text(used).caption);
  }
  return b;
}

bool Loader::decode_sample(SampleId id, int bucket, int64_t epoch, float* out, int h, int w,
                           SampleId& used) {
  const auto& index = dataset_.index();
  SampleId candidate = id;
  for (int attempt = 0; attempt <= kSubstituteAttempts; ++attempt) {
    const IndexRecord& r = index.record(candidate);
    // Flips are a pure function of (seed, epoch, sample): any worker, any world size.
    util::RandomStream flip_rng(util::stream_key(
        "sample.flip", {opts_.seed, static_cast<uint64_t>(epoch), candidate}));
    const bool flip = opts_.random_flip && flip_rng.below(2) == 1;
    const auto d = decode_to_bucket(std::string(index.text(candidate).path), h, w, flip,
                                    opts_.decode, static_cast<int>(r.width),
                                    static_cast<int>(r.height));
    {
      std::lock_guard<std::mutex> lock(bad_mutex_);
      ++bad_.decoded;
      if (d.ok()) {
        if (attempt > 0) ++bad_.substituted;
      } else {
        ++bad_.by_reason[reason_name(d.bad)];
        if (logged_.insert(candidate).second) {
          log::warn("bad sample {} '{}': {} ({}); using a substitute from the same bucket",
                    candidate, index.text(candidate).path, reason_name(d.bad), d.detail);
        }
      }
    }
    if (d.ok()) {
      to_chw_normalized(d.rgb, out);
      used = candidate;
      return true;
    }
    // The substitute is a pure function of (seed, epoch, sample, attempt) too.
    const auto& members = bucket_members(bucket);
    util::RandomStream pick(util::stream_key(
        "sample.substitute",
        {opts_.seed, static_cast<uint64_t>(epoch), id, static_cast<uint64_t>(attempt)}));
    candidate = members[pick.below(members.size())];
  }
  return false;
}

const std::vector<SampleId>& Loader::bucket_members(int bucket) {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  auto it = members_.find(bucket);
  if (it != members_.end()) return it->second;
  std::vector<SampleId> m;
  const auto& of = dataset_.bucket_of();
  for (size_t i = 0; i < of.size(); ++i) {
    if (of[i] == bucket) m.push_back(static_cast<SampleId>(i));
  }
  return members_.emplace(bucket, std::move(m)).first->second;
}

BadSampleCounts Loader::bad_counts() const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return bad_;
}

}  // namespace sana::data
