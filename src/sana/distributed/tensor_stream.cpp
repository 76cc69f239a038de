#include "sana/distributed/tensor_stream.h"

#include <algorithm>

namespace sana::dist {

namespace {

// One CPU tensor's bytes as a flat uint8 tensor sharing its memory.
torch::Tensor bytes_of_tensor(const torch::Tensor& t) {
  return torch::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())}, torch::kUInt8);
}

// Copies `n` bytes between the CPU `chunk` and the tensors' bytes laid end to end (from
// `stream_at`): into the chunk when `to_chunk`, else out of it.
void move_bytes(torch::Tensor& chunk, const std::vector<torch::Tensor>& pieces, int64_t stream_at, int64_t n,
                bool to_chunk) {
  int64_t start = 0;
  for (const auto& piece : pieces) {
    const int64_t len = piece.numel();
    const int64_t lo = std::max(start, stream_at), hi = std::min(start + len, stream_at + n);
    if (lo < hi) {
      auto in_piece = piece.narrow(0, lo - start, hi - lo);
      auto in_chunk = chunk.narrow(0, lo - stream_at, hi - lo);
      if (to_chunk) {
        in_chunk.copy_(in_piece);
      } else {
        in_piece.copy_(in_chunk);
      }
    }
    start += len;
  }
}

}  // namespace

int64_t stream_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += static_cast<int64_t>(t.nbytes());
  return total;
}

void broadcast_tensors(Runtime& rt, int root, int64_t total_bytes, const std::vector<torch::Tensor>& tensors,
                       int64_t chunk_bytes) {
  if (rt.world_size() == 1 || total_bytes == 0) return;
  std::vector<torch::Tensor> held, pieces;
  for (const auto& t : tensors) {
    held.push_back(t.is_contiguous() && t.device().is_cpu() ? t : t.to(torch::kCPU).contiguous());
    pieces.push_back(bytes_of_tensor(held.back()));
  }
  const bool sender = rt.rank() == root;
  for (int64_t at = 0; at < total_bytes; at += chunk_bytes) {
    const int64_t n = std::min(chunk_bytes, total_bytes - at);
    auto chunk = torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8).device(rt.device()));
    if (sender) {
      auto host = torch::empty({n}, torch::kUInt8);
      move_bytes(host, pieces, at, n, true);
      chunk.copy_(host);
    }
    rt.broadcast(chunk, root);  // collective
    if (!sender && !pieces.empty()) {
      auto host = chunk.to(torch::kCPU);
      move_bytes(host, pieces, at, n, false);
    }
  }
  // A receiving tensor that was not CPU-contiguous got a copy: give the values back.
  if (!sender) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (!held[k].is_same(tensors[k])) const_cast<torch::Tensor&>(tensors[k]).copy_(held[k]);
    }
  }
}

}  // namespace sana::dist
