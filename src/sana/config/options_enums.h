// The enumerated options of the run configuration (config.h): each enum and its names, in
// its order, as the YAML spells them (config/choices.h reads and prints them). No torch.
#pragma once

#include <array>
#include <string_view>

#include "sana/config/choices.h"

namespace sana::config {

// The enumerated options (config/choices.h): each enum's names in its order.
enum class Tail { drop, pad };
enum class SampleCacheMode { none, memory, disk };
enum class DataSampler { bucket, distributed };
enum class Precision { fp32, fp16, bf16 };
enum class Kernels { aten, fused };
enum class WorkingWeights { automatic, on, off };
enum class VaeType { none, torchscript, dc_ae };
enum class Weighting { logit_normal, sd3_mode, uniform, logit_normal_trigflow };
enum class OptimizerType { AdamW, CAME, CAME8bit, AdamW8bit, Lion, Adafactor, Prodigy, ScheduleFreeAdamW };
// CAME with or without 8-bit first moments: the same betas, eps and maths.
inline bool is_came(OptimizerType t) { return t == OptimizerType::CAME || t == OptimizerType::CAME8bit; }
enum class LrSchedule { constant, cosine, cosine_decay_to_constant };
enum class TimestepGrid { integer, continuous };
enum class AutoLr { none, sqrt, linear };
enum class PreviewOn { shared, rank0 };
enum class ControlSignal { canny, scribble, hed, dataset };
enum class LoraInit { gaussian, kaiming };
enum class FrozenDtype { fp32, bf16, fp16, int8, fp8, nf4 };
enum class Backend { automatic, gloo, nccl };
enum class DeviceKind { automatic, cpu, cuda };
enum class StateDevice { device, cpu };
enum class Elastic { restart, continue_on };

template <> struct Names<Tail> { static constexpr std::array<std::string_view, 2> values{"drop", "pad"}; };
template <> struct Names<SampleCacheMode> {
  static constexpr std::array<std::string_view, 3> values{"none", "memory", "disk"};
};
template <> struct Names<DataSampler> {
  static constexpr std::array<std::string_view, 2> values{"bucket", "distributed"};
};
template <> struct Names<Precision> {
  static constexpr std::array<std::string_view, 3> values{"fp32", "fp16", "bf16"};
};
template <> struct Names<Kernels> { static constexpr std::array<std::string_view, 2> values{"aten", "fused"}; };
template <> struct Names<WorkingWeights> {
  static constexpr std::array<std::string_view, 3> values{"auto", "true", "false"};
};
template <> struct Names<VaeType> {
  static constexpr std::array<std::string_view, 3> values{"none", "torchscript", "dc-ae"};
};
template <> struct Names<Weighting> {
  static constexpr std::array<std::string_view, 4> values{"logit_normal", "sd3_mode", "uniform", "logit_normal_trigflow"};
};
template <> struct Names<OptimizerType> {
  static constexpr std::array<std::string_view, 8> values{"AdamW", "CAME",      "CAME8bit", "AdamW8bit",
                                                          "Lion",  "Adafactor", "Prodigy",  "ScheduleFreeAdamW"};
};
template <> struct Names<LrSchedule> {
  static constexpr std::array<std::string_view, 3> values{"constant", "cosine", "cosine_decay_to_constant"};
};
template <> struct Names<AutoLr> {
  static constexpr std::array<std::string_view, 3> values{"none", "sqrt", "linear"};
};
template <> struct Names<TimestepGrid> {
  static constexpr std::array<std::string_view, 2> values{"integer", "continuous"};
};
template <> struct Names<PreviewOn> { static constexpr std::array<std::string_view, 2> values{"shared", "rank0"}; };
template <> struct Names<ControlSignal> {
  static constexpr std::array<std::string_view, 4> values{"canny", "scribble", "hed", "dataset"};
};
template <> struct Names<LoraInit> { static constexpr std::array<std::string_view, 2> values{"gaussian", "kaiming"}; };
template <> struct Names<FrozenDtype> {
  static constexpr std::array<std::string_view, 6> values{"fp32", "bf16", "fp16", "int8", "fp8", "nf4"};
};
template <> struct Names<Backend> { static constexpr std::array<std::string_view, 3> values{"auto", "gloo", "nccl"}; };
template <> struct Names<DeviceKind> {
  static constexpr std::array<std::string_view, 3> values{"auto", "cpu", "cuda"};
};
template <> struct Names<StateDevice> { static constexpr std::array<std::string_view, 2> values{"device", "cpu"}; };
template <> struct Names<Elastic> { static constexpr std::array<std::string_view, 2> values{"restart", "continue"}; };

}  // namespace sana::config
