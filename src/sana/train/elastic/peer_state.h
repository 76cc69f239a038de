// A run's state handed from rank 0 to a group that just grew (dist.elastic continue: a
// replacement taken in at a step boundary, Runtime::admit): what a checkpoint would hold,
// without a checkpoint. Every rank of the new group builds its trainer anew and restores
// this instead of reading a folder.
#pragma once

#include "sana/ckpt/checkpoint.h"
#include "sana/distributed/runtime.h"

namespace sana::train {

// Rank 0's `mine` on every rank: the run's state and each part's JSON through the store,
// then every tensor by broadcast, in order (on the device, the backend's way). Collective;
// `mine` is read on rank 0 only.
ckpt::Snapshot share_snapshot(dist::Runtime& rt, const ckpt::Snapshot* mine);

}  // namespace sana::train
