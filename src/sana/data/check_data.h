// `sana-train check-data`: decodes every sample (or the first N of a shuffled pass)
// through the real loader and reports good and substituted samples by reason and
// images/s. Exit 0 unless the bad fraction exceeds data.max_bad_fraction. The header
// needs no torch.
#pragma once

#include <cstdint>

#include "sana/config/config.h"

namespace sana::data {

int run_check_data(const config::Config& cfg, int64_t limit);

}  // namespace sana::data
