#include "sana/train/input/shared_dataset.h"

#include <chrono>
#include <thread>

#include "sana/util/log.h"

namespace sana::train {

namespace {

// Tests only (SharedDatasetOptions::index_delay_ms): rank 0's indexing takes longer.
void slow_indexing_for_tests(dist::Runtime& rt, const std::string& work, int64_t delay_ms) {
  const int64_t rounds = delay_ms / 100;
  for (int64_t i = 0; i < rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rt.work_progress(work, -1 - i);
  }
}

}  // namespace

// Rank 0 builds the index; the others then open its cache when work_dir is shared, or
// build their own when it is not.
data::Dataset open_dataset(const SharedDatasetOptions& o, dist::Runtime& rt) {
  const bool main_rank = rt.rank() == 0;
  data::IndexBuildOptions options;
  if (main_rank) options.on_rows = [&](uint64_t rows) { rt.work_progress(o.work, static_cast<int64_t>(rows)); };
  if (!main_rank) rt.wait_for_work(o.work, 0);
  if (main_rank) slow_indexing_for_tests(rt, o.work, o.index_delay_ms);
  auto dataset = data::Dataset::open(o.dataset, options, o.cell);
  if (main_rank) rt.work_done(o.work);
  if (main_rank && o.caption_features && o.captions.draws()) {
    log::warn("data.caption_selection_type {}: the caption features are each sample's own (data.load_text_feat), "
              "so no caption is chosen (upstream reads <key>.npz whatever caption it picked)",
              o.captions.type == data::CaptionSelection::clipscore ? "clipscore" : "proportion");
  }
  rt.agree("dataset (index content and bucket rule)", dataset.fingerprint());
  return dataset;
}

}  // namespace sana::train
