#include "sana/data/loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>

#include "sana/data/tensor_file.h"
#include "sana/util/log.h"
#include "sana/util/random.h"

namespace sana::data {

namespace {
constexpr int kSubstituteAttempts = 16;

// Reads a precomputed feature file with `read` into `out`; returns "" or why it is a bad sample.
template <class Out, class Read>
std::string read_feature(std::string_view path, const char* what, Out& out, Read&& read) {
  if (path.empty()) return fmt::format("no {}", what);
  try {
    out = read(std::string(path));
  } catch (const TensorFileError& e) {
    return fmt::format("unreadable {}: {}", what, e.what());
  }
  return "";
}
}  // namespace

// As upstream's datasets: T <= model_max_length tokens, the rest filled with copies of the
// last token under mask 0; the file's attention_mask when it has one, else all ones.
std::string Loader::place_text_features(const TextFeatures& feat, torch::Tensor features, torch::Tensor mask) const {
  const auto& f = feat.features;
  if (f.dim() != 2 || f.size(1) != opts_.text_channels || f.size(0) == 0) {
    return fmt::format("wrong text feature shape: {}, expected (1, T, {}) or (T, {})", fmt::join(f.sizes(), "x"),
                       opts_.text_channels, opts_.text_channels);
  }
  const int64_t len = f.size(0);
  if (len > opts_.text_length) {
    return fmt::format("too many text tokens: {} > text_encoder.model_max_length {}", len, opts_.text_length);
  }
  features.slice(0, 0, len).copy_(f);
  features.slice(0, len).copy_(f[len - 1].expand({opts_.text_length - len, f.size(1)}));
  mask.zero_();
  if (feat.mask.defined()) {
    mask.slice(0, 0, len).copy_(feat.mask);
  } else {
    mask.slice(0, 0, len).fill_(1);
  }
  return "";
}

Loader::Loader(const Dataset& dataset, const EpochPlan& plan, LoaderOptions opts,
               int64_t first_step)
    : dataset_(dataset), plan_(plan), opts_(std::move(opts)), cursor_(plan.cursor(first_step)) {
  if (opts_.micro_batch < 1 || opts_.world_size < 1) {
    throw LoaderError(fmt::format("micro-batch {} and world size {} must be at least 1", opts_.micro_batch,
                                  opts_.world_size));
  }
  const int64_t parts = opts_.whole_micro_batches ? micro_batches(plan.min_batch(), opts_.micro_batch)
                                                  : plan.min_batch();
  if (plan.steps() > first_step && parts < opts_.world_size) {
    throw LoaderError(fmt::format("a global batch of {} samples on {} processes leaves a process without samples",
                                  plan.min_batch(), opts_.world_size));
  }
  // The workers are the decode parallelism: OpenCV's own thread pool (one thread per core
  // in every process by default) would only add threads that compete with training.
  cv::setNumThreads(0);
  const int n = std::max(1, opts_.workers);
  running_ = n;
  for (int i = 0; i < n; ++i) threads_.emplace_back([this, guard = guard_] { work(guard); });
}

Loader::~Loader() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  room_.notify_all();
  ready_.notify_all();
  const bool all_returned = exited_.wait_for(lock, std::chrono::duration<double>(opts_.stop_wait_s),
                                             [&] { return running_ == 0; });
  const int stuck = running_;
  lock.unlock();
  if (all_returned) {
    for (auto& t : threads_) t.join();
    return;
  }
  log::warn("{} data loader thread{} still inside a read {} s after the loader stopped (a hung file "
            "system?); left behind so that this process can end",
            stuck, stuck == 1 ? " is" : "s are", opts_.stop_wait_s);
  // The workers outside a read finish what they touch of the loader first (bounded: no
  // read happens inside; an index page on a hung file system could).
  std::unique_lock<std::mutex> leave(guard_->mutex);
  if (!guard_->idle.wait_for(leave, std::chrono::duration<double>(opts_.stop_wait_s),
                             [&] { return guard_->inside == 0; })) {
    log::warn("a data loader thread is stuck outside a read too; leaving it behind anyway");
  }
  guard_->left = true;
  for (auto& t : threads_) t.detach();
}

void Loader::work(const std::shared_ptr<WorkerGuard>& guard) {
  if (!guard->enter()) return;
  struct Exit {  // every return counts, so the destructor knows when all workers are out
    Loader* loader;
    WorkerGuard& guard;
    bool left = false;  // the loader is gone: touch nothing
    ~Exit() {
      if (left) return;
      {
        std::lock_guard<std::mutex> lock(loader->mutex_);
        --loader->running_;
        loader->exited_.notify_all();
      }
      guard.leave();
    }
  } on_exit{this, *guard};
  while (true) {
    size_t k = 0;
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      room_.wait(lock, [&] {
        return stopping_ || plan_done_ || next_job_ < next_out_ + static_cast<size_t>(std::max(1, opts_.prefetch));
      });
      if (stopping_ || !refill()) return;
      job = std::move(pending_.front());
      pending_.pop_front();
      k = next_job_++;
    }
    try {
      Batch b = decode_job(job, *guard);
      std::lock_guard<std::mutex> lock(mutex_);
      done_.emplace(k, std::move(b));
    } catch (const LeftBehind&) {
      on_exit.left = true;
      return;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      errors_.emplace(k, std::current_exception());
    }
    ready_.notify_all();
  }
}

bool Loader::refill() {
  if (!pending_.empty()) return true;
  if (plan_done_) return false;
  StepBatch step;
  if (!cursor_.next(step)) {
    plan_done_ = true;
    ready_.notify_all();  // the consumer may be waiting for a batch that will not come
    return false;
  }
  const auto global = static_cast<int64_t>(step.ids.size());
  const auto [first, last] =
      rank_share_of(global, opts_.micro_batch, opts_.rank, opts_.world_size, opts_.whole_micro_batches);
  const int64_t count = micro_batches(last - first, opts_.micro_batch);
  for (int64_t t = 0; t < count; ++t) {
    const int64_t from = first + t * opts_.micro_batch, to = std::min(last, from + opts_.micro_batch);
    pending_.push_back({step.step, t, count, global, step.bucket,
                        std::vector<SampleId>(step.ids.begin() + from, step.ids.begin() + to)});
  }
  return true;
}

std::optional<Batch> Loader::next() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  const auto limit = std::chrono::duration<double>(opts_.wait_timeout_s);
  const auto ended = [&] { return plan_done_ && next_out_ >= next_job_; };
  const bool arrived = ready_.wait_for(lock, limit, [&] {
    return errors_.count(next_out_) > 0 || done_.count(next_out_) > 0 || ended();
  });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // An error surfaces at its own place in the plan: the same step on every worker count.
  if (auto e = errors_.find(next_out_); e != errors_.end()) std::rethrow_exception(e->second);
  if (!arrived) {
    throw LoaderError(fmt::format("no batch decoded within {} s (micro-batch {} of the epoch): a worker is stuck, "
                                  "e.g. on a hung network file system",
                                  opts_.wait_timeout_s, next_out_));
  }
  if (done_.count(next_out_) == 0) return std::nullopt;  // the plan's end
  auto it = done_.find(next_out_);
  Batch b = std::move(it->second);
  done_.erase(it);
  ++next_out_;
  lock.unlock();
  room_.notify_all();
  return b;
}

namespace {
template <class Job>
Batch batch_of(const Job& job) {
  Batch b;
  b.step = job.step;
  b.micro_step = job.micro_step;
  b.micro_count = job.micro_count;
  b.global_batch = job.global_batch;
  b.bucket = job.bucket;
  b.ids = job.ids;
  return b;
}
}  // namespace

void Loader::allocate(Batch& b, int h, int w) const {
  const auto n = static_cast<int64_t>(b.ids.size());
  auto options = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(opts_.pin_memory);
  const int64_t f = opts_.latent_downsample;
  if (opts_.load_latents) {
    b.latents = torch::empty({n, opts_.latent_channels, h / f, w / f}, options);
    if (opts_.control.kind == ControlKind::latents) b.control = torch::empty_like(b.latents);
  } else {
    b.images = torch::empty({n, 3, h, w}, options);
    if (opts_.control.kind != ControlKind::none) b.control = torch::empty({n, 3, h, w}, options);
  }
  if (opts_.masks) b.masks = torch::ones({n, 1, h, w}, options);
  if (opts_.prior != nullptr) b.prior_images = torch::empty({n, 3, h, w}, options);
  if (opts_.load_text_feat) {
    b.text_feat = torch::zeros({n, opts_.text_length, opts_.text_channels}, options);
    b.text_mask = torch::zeros({n, opts_.text_length}, options);
  }
}

Batch Loader::decode_job(const Job& job, WorkerGuard& guard) {
  Batch b = batch_of(job);
  const Bucket& bucket = dataset_.buckets().bucket(b.bucket);
  const int h = bucket.height, w = bucket.width;
  // The filter is the bucket's table's (upstream's choice) unless data.interpolation names one.
  DecodeOptions decode = opts_.decode;
  if (!decode.filter) decode.filter = filter_for_table(dataset_.buckets().table_of(b.bucket).name());
  allocate(b, h, w);
  const auto n = static_cast<int64_t>(b.ids.size());
  const auto& index = dataset_.index();
  for (int64_t i = 0; i < n; ++i) {
    const SampleId planned = b.ids[static_cast<size_t>(i)];
    const SampleId used = with_substitutes(planned, b.bucket, plan_.epoch(), [&](SampleId c) {
      const SampleText text = index.text(c);
      // Its size was unknown at indexing, so its bucket is a guess: never train it as is.
      const bool size_unknown = (index.record(c).flags & kSizeUnknown) != 0;
      const std::string unknown_size = "unreadable header: its size was unknown at indexing";
      if (size_unknown && opts_.load_latents) return unknown_size;
      if (opts_.load_latents) {
        const std::string bad = read_latent(std::string(text.latent), "latent", b.latents[i], h, w, guard);
        if (!bad.empty()) return bad;
        if (b.control.defined()) {  // ControlKind::latents: the sample's control latent, as prepare-features wrote it
          const std::string path = control_latent(text.meta);
          if (path.empty()) return std::string("no control latent: its metadata has no control_latent field");
          const std::string wrong = read_latent(path, "control latent", b.control[i], h, w, guard);
          if (!wrong.empty()) return wrong;
        }
      } else {
        const IndexRecord& r = index.record(c);
        const bool flip = flips(c);
        // Decoded without the flip (that is how the cache keeps it); flipped into the batch.
        cv::Mat rgb = opts_.cache ? opts_.cache->get(c, h, w) : cv::Mat();
        if (rgb.empty()) {
          const auto d = outside(guard, [path = std::string(text.path), h, w, decode,
                                         rw = static_cast<int>(r.width), rh = static_cast<int>(r.height)] {
            return decode_to_bucket(path, h, w, false, decode, rw, rh);
          });
          if (!d.ok()) return std::string(reason_name(d.bad)) + ": " + d.detail;
          if (size_unknown) return unknown_size;
          if (opts_.cache) opts_.cache->put(c, d.rgb);
          rgb = d.rgb;
        }
        const std::string bad = place_image(c, rgb, flip, i, b, decode, guard);
        if (!bad.empty()) return bad;
      }
      if (b.masks.defined()) {
        const std::string bad = read_mask(c, b.masks[i], h, w, decode, guard);
        if (!bad.empty()) return bad;
      }
      if (b.prior_images.defined()) {
        const std::string bad = read_prior(c, b.prior_images[i], h, w, decode, guard);
        if (!bad.empty()) return bad;
      }
      if (opts_.load_text_feat) {
        TextFeatures feat;
        const std::string bad = outside(guard, [path = std::string(text.text_feat), &feat] {
          return read_feature(path, "text features", feat, read_text_features);
        });
        if (!bad.empty()) return bad;
        const std::string wrong = place_text_features(feat, b.text_feat[i], b.text_mask[i]);
        if (!wrong.empty()) return wrong;
      }
      return std::string();
    }, b);
    if (used != planned) ++b.substituted;
    b.decoded_ids.push_back(used);
    b.labels.push_back(index.record(used).label);
    b.captions.push_back(caption_of(used));
  }
  return b;
}

std::string Loader::read_latent(const std::string& path, const char* what, torch::Tensor row, int h, int w,
                                WorkerGuard& guard) const {
  torch::Tensor lat;
  const std::string bad = outside(guard, [path, what, &lat] {
    return read_feature(path, what, lat, [](const std::string& p) { return read_tensor_file(p); });
  });
  if (!bad.empty()) return bad;
  if (lat.dim() == 4 && lat.size(0) == 1) lat = lat[0];  // upstream accepts (1, C, h, w)
  if (lat.sizes() != row.sizes()) {
    return fmt::format("wrong {} shape: {} is not {} for bucket {}x{}", what, fmt::join(lat.sizes(), "x"),
                       fmt::join(row.sizes(), "x"), h, w);
  }
  row.copy_(lat);
  return "";
}

// Flips are a pure function of (seed, epoch, sample): any worker, any world size.
// Precomputed latents are never flipped.
bool Loader::flips(SampleId id) const {
  if (!opts_.random_flip || opts_.load_latents) return false;
  util::RandomStream rng(util::stream_key("sample.flip", {opts_.seed, static_cast<uint64_t>(plan_.epoch()), id}));
  return rng.below(2) == 1;
}

std::string Loader::read_mask(SampleId id, torch::Tensor row, int h, int w, const DecodeOptions& decode,
                              WorkerGuard& guard) const {
  const SampleText text = dataset_.index().text(id);
  const std::string path = mask_image(text.meta);
  cv::Mat mask;  // 8-bit, h x w, `step` bytes from one pixel to the next
  int step = 1;
  if (path.empty() && !opts_.alpha_masks) return "";  // no mask: the row stays all ones
  if (path.empty()) {  // the image's own alpha channel, if it has one; else the row stays all ones
    const auto d = outside(guard, [image = std::string(text.path), h, w, decode] {
      return decode_alpha_to_bucket(image, h, w, decode);
    });
    if (!d.ok()) return fmt::format("alpha channel: {}: {}", reason_name(d.bad), d.detail);
    if (d.alpha.empty()) return "";
    mask = d.alpha;
  } else {
    const auto d = outside(guard, [path, h, w, decode] { return decode_to_bucket(path, h, w, false, decode); });
    if (!d.ok()) return fmt::format("mask '{}': {}: {}", path, reason_name(d.bad), d.detail);
    mask = d.rgb;  // its first channel
    step = 3;
  }
  const bool flip = flips(id);  // as the image
  float* out = row.data_ptr<float>();
  for (int y = 0; y < h; ++y) {
    const uchar* px = mask.ptr<uchar>(y);
    for (int x = 0; x < w; ++x) out[static_cast<size_t>(y) * w + x] = px[step * (flip ? w - 1 - x : x)] / 255.0f;
  }
  return "";
}

std::string Loader::place_image(SampleId id, const cv::Mat& rgb, bool flip, int64_t row, Batch& b,
                                const DecodeOptions& decode, WorkerGuard& guard) const {
  if (b.control.defined()) {
    cv::Mat map;
    if (opts_.control.kind == ControlKind::dataset) {  // the sample's own control image, at the image's bucket
      const std::string path = control_image(dataset_.index().text(id).meta);
      if (path.empty()) return "no control image: its metadata has no control field";
      const auto d = outside(guard, [path, h = rgb.rows, w = rgb.cols, decode] {
        return decode_to_bucket(path, h, w, false, decode);
      });
      if (!d.ok()) return fmt::format("control image '{}': {}: {}", path, reason_name(d.bad), d.detail);
      map = d.rgb;
    } else {  // of the unflipped bucket image; a scribble's thickness drawn as the flip is
      int thickness = opts_.control.thickness;
      if (opts_.control.kind == ControlKind::scribble && thickness < 0) {
        util::RandomStream draw(util::stream_key("sample.scribble_thickness",
                                                 {opts_.seed, static_cast<uint64_t>(plan_.epoch()), id}));
        thickness = static_cast<int>(draw.below(25));  // upstream's random.randint(0, 24)
      }
      map = control_map(rgb, opts_.control, thickness);
    }
    to_chw_normalized(map, b.control[row].data_ptr<float>(), flip);  // mirrored with the image
  }
  to_chw_normalized(rgb, b.images[row].data_ptr<float>(), flip);
  return "";
}

std::string Loader::caption_of(SampleId id) const {
  const SampleText text = dataset_.index().text(id);
  util::RandomStream rng(util::stream_key("sample.caption", {opts_.seed, static_cast<uint64_t>(plan_.epoch()), id}));
  return opts_.caption.choose(text.caption, text.meta, rng);
}

void Loader::count(SampleId candidate, const std::string& reason, bool substitute) {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  ++bad_.decoded;
  if (reason.empty()) {
    if (substitute) ++bad_.substituted;
    return;
  }
  // Each bad sample once under its reason, however often it is tried (as planned or as
  // another's substitute).
  if (logged_.insert(candidate).second) {
    ++bad_.by_reason[reason.substr(0, reason.find(':'))];
    log::warn("bad sample {} '{}': {}; using a substitute (from the same bucket, or any sample where the "
              "bucket has no other)", candidate,
              dataset_.index().text(candidate).path, reason);
  }
}

SampleId Loader::with_substitutes(SampleId id, int bucket, int64_t epoch,
                                  const std::function<std::string(SampleId)>& read,
                                  Batch& batch) {
  SampleId candidate = id;
  std::set<SampleId> tried;
  const auto& members = dataset_.members();
  const uint64_t total = dataset_.index().size();
  // Substitutes come from the bucket unless it has no other member; then from anywhere
  // (the decoder fits any image to this bucket, so the batch keeps its shape).
  const auto in_bucket = static_cast<uint64_t>(members.count(bucket));
  const bool whole_dataset = in_bucket <= 1;
  for (int attempt = 0; attempt <= kSubstituteAttempts; ++attempt) {
    tried.insert(candidate);
    std::string reason;
    try {
      reason = read(candidate);
    } catch (const std::exception& e) {
      reason = std::string("unreadable: ") + e.what();
    }
    ++batch.reads;
    count(candidate, reason, attempt > 0);
    if (reason.empty()) return candidate;
    batch.bad_reasons.push_back(reason.substr(0, reason.find(':')));
    const uint64_t pool = whole_dataset ? total : in_bucket;
    if (tried.size() >= pool) break;
    // The substitute is a pure function of (seed, epoch, sample, attempt) too.
    util::RandomStream pick(util::stream_key(
        "sample.substitute",
        {opts_.seed, static_cast<uint64_t>(epoch), id, static_cast<uint64_t>(attempt)}));
    do {
      const uint64_t k = pick.below(pool);
      candidate = whole_dataset ? static_cast<SampleId>(k) : members.member(bucket, static_cast<int64_t>(k));
    } while (tried.count(candidate) > 0);
  }
  throw LoaderError(fmt::format(
      "sample {} and {} substitutes ({}) could not be read: the data is mostly unreadable; run "
      "sana-train check-data",
      id, tried.size() - 1, dataset_.buckets().describe(bucket)));
}

BadSampleCounts Loader::bad_counts() const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return bad_;
}

}  // namespace sana::data
