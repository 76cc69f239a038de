// Tensors moved between ranks as one stream of bytes, in chunks through the device: how
// checkpoints move entries a rank does not read itself, and how format 2 brings ZeRO's
// shares to its single writer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sana/distributed/runtime.h"

namespace sana::dist {

// The bytes of tensors laid end to end (CPU, contiguous).
int64_t stream_bytes(const std::vector<torch::Tensor>& tensors);

// A collective: `root`'s tensors (`total_bytes` of them laid end to end) into every other
// rank's, in chunks of at most `chunk_bytes` (one broadcast each). `tensors`: on `root`
// the values sent; elsewhere the CPU tensors that take them (same dtypes and shapes), or
// none on a rank that only passes the stream along.
void broadcast_tensors(Runtime& rt, int root, int64_t total_bytes, const std::vector<torch::Tensor>& tensors,
                       int64_t chunk_bytes = int64_t{64} << 20);

}  // namespace sana::dist
