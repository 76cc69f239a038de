// Loader::read_prior (data/loader.h): DreamBooth's class images beside each sample.
#include <fmt/format.h>

#include <algorithm>

#include "sana/data/dataset.h"
#include "sana/data/loader.h"

namespace sana::data {

std::string Loader::read_prior(SampleId id, torch::Tensor row, int h, int w, const DecodeOptions& decode,
                               WorkerGuard& guard) const {
  const auto& classes = opts_.prior->index();
  const uint64_t count = opts_.prior_count > 0 ? std::min<uint64_t>(opts_.prior_count, classes.size()) : classes.size();
  // Over the epochs every class image comes round, whichever is larger (diffusers pairs
  // example i with class image i mod their count, over max(instances, classes) examples).
  const uint64_t k = (static_cast<uint64_t>(plan_.epoch()) * dataset_.index().size() + id) % count;
  const std::string path(classes.text(static_cast<SampleId>(k)).path);
  const auto d = outside(guard, [path, h, w, decode] { return decode_to_bucket(path, h, w, false, decode); });
  if (!d.ok()) return fmt::format("class image '{}': {}: {}", path, reason_name(d.bad), d.detail);
  to_chw_normalized(d.rgb, row.data_ptr<float>());
  return "";
}

}  // namespace sana::data
