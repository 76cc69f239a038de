// The dataset as every rank of a run opens it (training, prepare-features): rank 0 builds
// the index first, reading every image header once; the others wait for it with a bound
// that only a stalled rank 0 reaches, then all ranks agree on its content.
#pragma once

#include "sana/config/config.h"
#include "sana/data/dataset.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// Throws IndexError (a config or data problem), Disagreement (ranks see other data) or
// PeerFailure.
data::Dataset open_dataset(const config::Config& cfg, dist::Runtime& rt);

}  // namespace sana::train
