// How the CUDA runtime runs a training run's steps (train.cudnn_benchmark,
// train.cuda_sync_debug): cuDNN's benchmark mode, which times the convolution algorithms
// for each new shape once and keeps the fastest (the depthwise 3x3 of GLUMBConv over a
// bucket's fixed shapes), and c10::cuda's sync-debug mode, which warns about (or fails on)
// every operation that makes the host wait for the device. Nothing on a CPU run.
#pragma once

#include <string>

namespace sana::train {

struct CudaModes {
  bool cudnn_benchmark = true;
  std::string sync_debug = "off";  // off, warn, error
};

// Sets both for this process (cuda_modes.cpp); says so in the log where they are not the
// defaults.
void apply_cuda_modes(const CudaModes& modes);
// What is in force now: cuDNN's benchmark flag and the sync-debug mode's name.
CudaModes current_cuda_modes();

}  // namespace sana::train
