// What each rank holds, measured after its first step (not estimated: the estimate is
// memory_estimate.h, which `sana-train model` prints and whose static fields must equal
// these): bytes of the parameters, the gradient buckets, the optimizer state, the EMA and
// other ranks' parameters gathered at once at the most (ZeRO stage 3), and how far the
// memory peak rose during the step's forward and backward (the activations; the CUDA
// allocator's peak on a GPU, the CPU allocator's count of tensors on a CPU:
// counting_allocator.h). Rank 0 writes all ranks' to work_dir/memory.json; every rank logs
// its own line.
#pragma once

#include <torch/torch.h>

#include "sana/train/report/counting_allocator.h"

#include <memory>
#include <string>
#include <vector>

namespace sana::train {

struct MemoryUse {
  int rank = 0;
  int64_t parameters = 0, gradients = 0, optimizer = 0, ema = 0, gathered = 0;  // bytes
  int64_t working = 0;  // train.working_weights: the half copies of the weights (RankState's)
  // The frozen encoders the run loaded on the device (VAE, text encoder): their weights'
  // bytes, which `sana-train model`'s count from their config.json must equal.
  int64_t encoders = 0;
  // The state kept in host memory (train.offload_optimizer, train.ema_device cpu), which the
  // fields above leave out: the estimate's RankState host fields.
  int64_t host_weights = 0, host_gradients = 0, host_optimizer = 0, host_ema = 0;
  int64_t host_blocks = 0;  // train.offload_blocks: the swapped blocks' host copies (`parameters` leaves them out)
  int64_t activations_peak = -1;  // bytes; -1 where the peak cannot be read
  std::string activations_source;  // "cuda allocator peak" or "cpu allocator peak"
  // The step's largest micro-batch and its grid of image tokens (where the peak was measured).
  int64_t micro_batch = 0, h_tokens = 0, w_tokens = 0;
  std::string json() const;
  static MemoryUse from_json(const std::string& text);
  std::string line() const;  // one log line
};

// Bytes of the storages behind `tensors`, each storage once: views into one flat bucket
// (parameters, gradients, AdamW's moments) count as the whole bucket, alignment gaps included.
int64_t bytes_of(const std::vector<torch::Tensor>& tensors);

// Brackets a region (the first step's forward and backward): the peak's rise above the use
// at begin(), read at end().
class PeakProbe {
 public:
  explicit PeakProbe(torch::Device device);
  ~PeakProbe();
  void begin();
  void end();
  // Bytes; -1 when this system cannot reset or read the peak, or the region has not ended.
  int64_t growth() const { return growth_; }
  const char* source() const;

 private:
  torch::Device device_;
  int64_t at_begin_ = -1;
  int64_t growth_ = -1;
  std::unique_ptr<CountingScope> counting_;  // on a CPU, between begin() and end()
};

// Writes every rank's use (in rank order) to `path` atomically: {"ranks": [...]}.
void write_memory_json(const std::string& path, const std::vector<MemoryUse>& ranks);

// The CUDA allocator's peak on device `index` (memory_peak_cuda.cpp; -1 without CUDA).
void reset_cuda_peak(int index);
int64_t cuda_peak_bytes(int index);
int64_t cuda_allocated_bytes(int index);

}  // namespace sana::train
