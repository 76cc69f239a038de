// AdamW with 8-bit moments as bitsandbytes' AdamW8bit computes it on CUDA (upstream's
// AdamW8bitWrapper; bitsandbytes >= 0.44: blocks of 256 elements). A parameter with at
// least `min_size` elements keeps both moments as uint8 codes of two 256-entry "dynamic"
// maps (signed for the first moment, unsigned for the second) times an fp32 absmax per
// block of 256 elements in row-major order; smaller ones keep fp32 moments. One step, per
// element, in float32:
//   m = code1[c1] * absmax1 * b1 + (1 - b1) g,   v = code2[c2] * absmax2 * b2 + ((1 - b2) g) g
//   (a non-finite g: m = v = 0 and the element is left alone)
//   new absmax per block: max |m| and max v over its 256 lanes (a short last block's
//   padding lanes count, holding code1[128] * absmax1 * b1)
//   p = p + step_size * m / (sqrt(v) + c2 eps), step_size = -lr c2 / c1,
//   c1 = 1 - b1^t, c2 = sqrt(1 - b2^t); then p = p (1 - lr wd) (decay after the update)
//   the codes: the nearest entry to m / absmax1' (v / absmax2'), a tie to the even index,
//   and a first-moment code whose sign differs from m's moved one step towards m's sign.
// fp32 moments update as bitsandbytes' 32-bit kernel does (the same formulas, no codes).
// Checkpoints hold "<param>/exp_avg.codes" (uint8), ".absmax" and the same for exp_avg_sq;
// fp32 moments of an AdamW checkpoint are quantized on load (and AdamW dequantizes these).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "sana/train/optim/optimizer.h"

namespace sana::train {

class AdamW8bit : public StatefulOptimizer {
 public:
  static constexpr int64_t kBlock = 256;
  AdamW8bit(NamedParams params, std::vector<double> betas, double eps, double weight_decay, int64_t min_size);
  void apply(double lr) override;
  const char* name() const override { return "AdamW8bit"; }
  bool quantized(const torch::Tensor& p) const { return p.numel() >= min_size_; }
  // bitsandbytes' create_dynamic_map(signed, 7, 8): 256 float32 values, ascending.
  static torch::Tensor dynamic_map(bool is_signed);
  // The code of each of `x` (float32) in `map`, as bitsandbytes' quantize_2D chooses it.
  static torch::Tensor nearest_code(const torch::Tensor& x, const torch::Tensor& map);
  // A moment's fp32 values from its codes (any shape) and per-block absmax.
  static torch::Tensor dequantize(const torch::Tensor& codes, const torch::Tensor& absmax, bool is_signed);
  // An AdamW8bit state (one parameter's) as AdamW's fp32 "exp_avg" and "exp_avg_sq", in place.
  static void to_fp32_moments(std::map<std::string, torch::Tensor>& state);

 private:
  void step_8bit(State& s, torch::Tensor& p, const torch::Tensor& g, float lr);
  void step_32bit(State& s, torch::Tensor& p, const torch::Tensor& g, float lr);
  // An 8-bit state from fp32 moments `m`, `v` (a checkpoint of AdamW's).
  void quantize_moments(State& s, const torch::Tensor& m, const torch::Tensor& v) const;
  float beta1_, beta2_, eps_, weight_decay_;
  int64_t min_size_;
  torch::Tensor map1_, map2_, mids1_, mids2_;  // per device on first use
};

}  // namespace sana::train
