// The per-process data loader: decodes this rank's micro-batches of an epoch plan on
// data.num_workers threads into a bounded prefetch queue, in plan order, so a batch's
// contents never depend on the number of workers. A bad sample is replaced by a
// deterministic substitute from the same bucket (counted by reason, logged once per file):
// batch shapes and step counts never change. Never calls a collective.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sana/data/dataset.h"
#include "sana/data/decode.h"
#include "sana/data/loader_options.h"
#include "sana/data/sample_cache.h"
#include "sana/data/tensor_file.h"
#include "sana/util/error.h"

namespace sana::data {

struct Batch {
  int64_t step = 0;
  int64_t micro_step = 0;
  int64_t micro_count = 0;   // this rank's micro-batches in the step
  int64_t global_batch = 0;  // samples in the step on all ranks
  int bucket = 0;
  torch::Tensor images;               // [micro, 3, h, w] float32 in [-1, 1] (pixels)
  torch::Tensor latents;              // [micro, C, h/f, w/f] (load_latents)
  torch::Tensor control;              // the images' control maps: [micro, 3, h, w] in [-1, 1], or as latents
  // train.masked_loss: [micro, 1, h, w] in [0, 1] at the bucket's pixels, flipped with the
  // image: the sample's `mask` image (its first channel / 255), all ones for a sample without one.
  torch::Tensor masks;
  // data.class_data_dir (LoaderOptions::prior): each sample's class image, [micro, 3, h, w] in
  // [-1, 1] at the sample's bucket (never flipped).
  torch::Tensor prior_images;
  torch::Tensor text_feat;            // [micro, L, D] (load_text_feat), padded with the last token
  torch::Tensor text_mask;            // [micro, L] 1 for tokens to attend to
  std::vector<SampleId> ids;          // as planned
  std::vector<SampleId> decoded_ids;  // after substitutions
  std::vector<int32_t> labels;        // -1: none
  std::vector<std::string> captions;
  int substituted = 0;
  int64_t reads = 0;                     // files tried, substitutes included
  std::vector<std::string> bad_reasons;  // one per failed read, in order
};

struct BadSampleCounts {
  std::map<std::string, int64_t> by_reason;  // distinct bad samples, by reason
  int64_t substituted = 0;
  int64_t decoded = 0;
};

class LoaderError : public sana::RunError {
 public:
  explicit LoaderError(const std::string& what) : RunError(what, "loader error") {}
};

class Loader {
 public:
  // Starts decoding at `first_step` (a resume position) of `plan`.
  Loader(const Dataset& dataset, const EpochPlan& plan, LoaderOptions opts, int64_t first_step = 0);
  // The loader keeps a reference to the plan: a temporary would dangle.
  Loader(const Dataset& dataset, EpochPlan&& plan, LoaderOptions opts, int64_t first_step = 0) = delete;
  // Stops the workers, mid-epoch too, and joins them. A worker still inside a read after
  // opts.stop_wait_s (a hung network file system) is left behind with a warning instead of
  // hanging the process; should its read ever return, it ends without touching the
  // loader (WorkerGuard).
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next micro-batch in plan order, or nothing at the end of the epoch.
  std::optional<Batch> next();
  // Seconds the caller has spent waiting inside next().
  double wait_seconds() const { return wait_seconds_; }
  BadSampleCounts bad_counts() const;

 private:
  struct Job {
    int64_t step = 0, micro_step = 0, micro_count = 0, global_batch = 0;
    int bucket = 0;
    std::vector<SampleId> ids;
  };
  // The next step's micro-batches of this rank into pending_ (mutex_ held); false at the
  // plan's end.
  bool refill();
  // What a worker shares with the loader that must outlive it: a worker counts itself
  // `inside` whenever it touches the loader and steps out only around each read that may
  // never return (outside()); the destructor waits until none is inside and marks the
  // guard `left`, so a read that returns later finds the flag, not freed memory. (A plain
  // mutex and condition: ThreadSanitizer does not see a timed shared_mutex's ordering.)
  struct WorkerGuard {
    std::mutex mutex;
    std::condition_variable idle;  // `inside` went down
    int inside = 0;
    bool left = false;
    bool enter() {  // false once the loader is gone
      std::lock_guard<std::mutex> lock(mutex);
      if (left) return false;
      ++inside;
      return true;
    }
    void leave() {
      std::lock_guard<std::mutex> lock(mutex);
      --inside;
      idle.notify_all();
    }
  };
  struct LeftBehind {};  // thrown in a worker whose loader is gone
  // Runs `read` (it touches only its own captures) outside the loader; throws LeftBehind
  // when the loader was destroyed meanwhile, else returns or rethrows.
  template <class Read>
  static auto outside(WorkerGuard& guard, Read&& read) {
    guard.leave();
    decltype(read()) result;
    try {
      result = read();
    } catch (...) {
      if (!guard.enter()) throw LeftBehind{};
      throw;
    }
    if (!guard.enter()) throw LeftBehind{};
    return result;
  }
  void work(const std::shared_ptr<WorkerGuard>& guard);
  Batch decode_job(const Job& job, WorkerGuard& guard);
  // The batch's tensors for its samples at bucket h x w: images or latents, control maps,
  // masks (ones), caption features, as the options ask.
  void allocate(Batch& b, int h, int w) const;
  // Tries `read` on `id`, then on substitutes from its bucket (never the same sample
  // twice; from the whole dataset when the bucket has no other); `read` returns "" on
  // success or the reason it failed. Returns the id that worked.
  SampleId with_substitutes(SampleId id, int bucket, int64_t epoch,
                            const std::function<std::string(SampleId)>& read, Batch& batch);
  void count(SampleId candidate, const std::string& reason, bool substitute);
  // The caption sample `id` trains on this epoch: like its flip, a pure function of
  // (seed, epoch, sample), whatever the worker or world size (data/sample_meta.h).
  std::string caption_of(SampleId id) const;
  // A latent file (`what`: "latent", "control latent") into `row`, which gives its shape; ""
  // or why not.
  std::string read_latent(const std::string& path, const char* what, torch::Tensor row, int h, int w,
                          WorkerGuard& guard) const;
  // Sample `id`'s decoded bucket image (unflipped, as decoded and cached) into row `row` of
  // the batch, flipped or not, and its control map when the batch carries them: made from
  // the image, or the sample's control image (ControlKind::dataset). "" or why not.
  std::string place_image(SampleId id, const cv::Mat& rgb, bool flip, int64_t row, Batch& b,
                          const DecodeOptions& decode, WorkerGuard& guard) const;
  // Whether sample `id` is mirrored this epoch (data.random_flip; never for precomputed latents).
  bool flips(SampleId id) const;
  // Sample `id`'s loss mask (its `mask` image at the bucket's h x w, first channel / 255;
  // without one and with LoaderOptions::alpha_masks, its image's alpha channel / 255; flipped
  // as its image) into `row` [1, h, w];
  // a sample with neither leaves the row as it is (ones). "" or why not.
  std::string read_mask(SampleId id, torch::Tensor row, int h, int w, const DecodeOptions& decode,
                        WorkerGuard& guard) const;
  // data.class_data_dir: the class image sample `id` trains beside this epoch
  // (prior_index()) into `row` [3, h, w], cover-cropped to the sample's bucket. "" or why not.
  std::string read_prior(SampleId id, torch::Tensor row, int h, int w, const DecodeOptions& decode,
                         WorkerGuard& guard) const;
  // Pads or rejects one sample's caption features into its rows of a batch; "" or why not.
  std::string place_text_features(const TextFeatures& feat, torch::Tensor features, torch::Tensor mask) const;

  const Dataset& dataset_;
  const EpochPlan& plan_;
  LoaderOptions opts_;
  std::shared_ptr<WorkerGuard> guard_ = std::make_shared<WorkerGuard>();
  std::vector<std::thread> threads_;

  std::mutex mutex_;
  std::condition_variable ready_;  // a result arrived
  std::condition_variable room_;   // the consumer took one: room to decode ahead
  EpochPlan::Cursor cursor_;       // steps are read from the plan as workers reach them
  std::deque<Job> pending_;        // the current step's micro-batches not yet taken
  bool plan_done_ = false;         // the cursor has passed the last step
  size_t next_job_ = 0;            // next job a worker takes
  size_t next_out_ = 0;            // next job the consumer takes
  std::map<size_t, Batch> done_;
  std::map<size_t, std::exception_ptr> errors_;  // rethrown in plan order, like batches
  bool stopping_ = false;
  int running_ = 0;                 // workers that have not returned
  std::condition_variable exited_;  // a worker returned
  double wait_seconds_ = 0;

  mutable std::mutex bad_mutex_;
  BadSampleCounts bad_;
  std::set<SampleId> logged_;
};

}  // namespace sana::data
