// What each rank holds, measured after its first step (not estimated: the estimate is
// memory_estimate.h, which `sana-train model` prints and whose static fields must equal
// these): bytes of the parameters, the gradient buckets, the optimizer state, the EMA and
// gathered-parameter buffers (0: every rank keeps whole parameters), and how far the
// memory peak rose during the step's forward and backward (the activations; the CUDA
// allocator's peak on a GPU, the process's peak resident size on a CPU). Rank 0 writes all
// ranks' to work_dir/memory.json; every rank logs its own line.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace sana::train {

struct MemoryUse {
  int rank = 0;
  int64_t parameters = 0, gradients = 0, optimizer = 0, ema = 0, gathered = 0;  // bytes
  int64_t activations_peak = -1;  // bytes; -1 where the peak cannot be read
  std::string activations_source;  // "cuda allocator peak" or "peak resident size (VmHWM)"
  std::string json() const;
  static MemoryUse from_json(const std::string& text);
  std::string line() const;  // one log line
};

// Bytes of the storages behind `tensors`, each storage once: views into one flat bucket
// (parameters, gradients, AdamW's moments) count as the whole bucket, alignment gaps included.
int64_t bytes_of(const std::vector<torch::Tensor>& tensors);

// Brackets a region (the first step's forward and backward): the peak's rise above the use
// at begin().
class PeakProbe {
 public:
  explicit PeakProbe(torch::Device device) : device_(device) {}
  void begin();
  // Bytes; -1 when this system cannot reset or read the peak.
  int64_t growth() const;
  const char* source() const;

 private:
  torch::Device device_;
  int64_t at_begin_ = -1;
  bool reset_ = false;
};

// Writes every rank's use (in rank order) to `path` atomically: {"ranks": [...]}.
void write_memory_json(const std::string& path, const std::vector<MemoryUse>& ranks);

// The CUDA allocator's peak on device `index` (memory_peak_cuda.cpp; -1 without CUDA).
void reset_cuda_peak(int index);
int64_t cuda_peak_bytes(int index);
int64_t cuda_allocated_bytes(int index);

}  // namespace sana::train
