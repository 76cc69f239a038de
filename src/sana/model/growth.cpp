#include "sana/model/growth.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string_view>
#include <vector>

#include "sana/model/weights.h"

namespace sana::model {

namespace {

constexpr std::string_view kBlocks = "blocks.";

// "blocks.12.attn.qkv.weight" -> 12; -1 for a tensor outside the blocks.
int64_t block_of(const std::string& key) {
  if (key.compare(0, kBlocks.size(), kBlocks) != 0) return -1;
  const size_t dot = key.find('.', kBlocks.size());
  if (dot == std::string::npos || dot == kBlocks.size()) return -1;
  int64_t n = 0;
  for (size_t i = kBlocks.size(); i < dot; ++i) {
    if (key[i] < '0' || key[i] > '9') return -1;
    n = n * 10 + (key[i] - '0');
  }
  return n;
}

// The same tensor's name in block `to` ("blocks.<to>.<rest>").
std::string in_block(const std::string& key, int64_t to) {
  return fmt::format("blocks.{}{}", to, key.substr(key.find('.', kBlocks.size())));
}

bool contains(const std::string& key, const char* part) { return key.find(part) != std::string::npos; }

// What a zero-gated repeat starts at zero: its modulation table and its three output
// projections (upstream's list; "attn.proj" also matches "cross_attn.proj").
bool gated(const std::string& key) {
  return contains(key, "scale_shift_table") || contains(key, "attn.proj.weight") || contains(key, "attn.proj.bias") ||
         contains(key, "mlp.point_conv.conv.weight") || contains(key, "mlp.point_conv.conv.bias");
}

int64_t block_count(const std::vector<std::string>& keys) {
  int64_t n = 0;
  for (const auto& k : keys) n = std::max(n, block_of(k) + 1);
  return n;
}

class Grower {
 public:
  Grower(torch::nn::Module& model, const GrowthOptions& o)
      : o_(o), source_(read_state_dict(o.source)), gen_(at::detail::createCPUGenerator(o.seed)) {
    for (const auto& [name, t] : module_tensors(model)) {
      order_.push_back(name);
      target_[name] = t.detach().to(torch::kCPU).clone();
    }
  }

  GrowthReport run() {
    std::vector<std::string> source_keys;
    for (const auto& [name, t] : source_) source_keys.push_back(name);
    report_.source_blocks = block_count(source_keys);
    check_depths();
    copy_outside_blocks();
    const int64_t S = o_.source_layers, T = o_.target_layers;
    switch (o_.strategy) {
      case GrowthStrategy::cyclic:
        for (int64_t i = 0; i < T; ++i) copy_block(i % S, i, o_.zero_gate && i >= S);
        break;
      case GrowthStrategy::block_expand:
        for (int64_t s = 0; s < S; ++s) {
          for (int64_t k = 0; k < o_.expand_ratio; ++k) copy_block(s, s * o_.expand_ratio + k, o_.zero_gate && k > 0);
        }
        break;
      case GrowthStrategy::progressive:
        for (int64_t i = 0; i < S; ++i) copy_block(i, i, false);
        for (int64_t i = S; i < T; ++i) {
          for_block(i, [&](const std::string& key, torch::Tensor& t) {
            const torch::Tensor& prev = target_.at(in_block(key, i - 1));
            t = prev + draw(prev) * o_.noise_scale;
          });
        }
        break;
      case GrowthStrategy::interpolation:
        for (int64_t i = 0; i < S; ++i) copy_block(i, i, false);
        for (int64_t i = S; i < T; ++i) {
          const int64_t lo = i * S / T, hi = std::min(lo + 1, S - 1);
          const double a = static_cast<double>(i * S) / static_cast<double>(T) - static_cast<double>(lo);
          for_block(i, [&](const std::string& key, torch::Tensor& t) {
            t = (1 - a) * source_at(in_block(key, lo)) + a * source_at(in_block(key, hi));
          });
        }
        break;
      case GrowthStrategy::random:
        for (int64_t i = 0; i < S; ++i) copy_block(i, i, false);
        break;
      case GrowthStrategy::constant:
        for (int64_t i = 0; i < S; ++i) copy_block(i, i, false);
        for (int64_t i = S; i < T; ++i) for_block(i, [&](const std::string& key, torch::Tensor& t) { t = constant(key, t); });
        break;
    }
    return report_;
  }

  void write_into(torch::nn::Module& model) const {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : module_tensors(model)) t.copy_(target_.at(name));
  }

 private:
  void check_depths() {
    const int64_t depth = block_count(order_);
    if (o_.target_layers != depth) {
      throw GrowthError(fmt::format("model_growth.target_num_layers: {}, but model.model has {} blocks; set it to {}",
                                    o_.target_layers, depth, depth));
    }
    if (o_.source_layers > report_.source_blocks) {
      throw GrowthError(fmt::format("model_growth.source_num_layers: {}, but '{}' has {} blocks", o_.source_layers,
                                    o_.source, report_.source_blocks));
    }
    if (o_.strategy == GrowthStrategy::block_expand && o_.source_layers * o_.expand_ratio != o_.target_layers) {
      throw GrowthError(fmt::format("model_growth.init_params.expand_ratio: block_expand grows {} blocks {} times "
                                    "into {}, but the target has {}; set it to target / source",
                                    o_.source_layers, o_.expand_ratio, o_.source_layers * o_.expand_ratio,
                                    o_.target_layers));
    }
  }

  // Every tensor outside the blocks, upstream's fixed pos_embed excepted.
  void copy_outside_blocks() {
    for (const auto& [name, t] : source_) {
      if (block_of(name) < 0 && name != "pos_embed") set(name, t, false);
    }
  }

  // Source block `from` into target block `to`; `gate`: with the zero-gate rule.
  void copy_block(int64_t from, int64_t to, bool gate) {
    const std::string prefix = fmt::format("blocks.{}.", from);
    for (const auto& [name, t] : source_) {
      if (name.compare(0, prefix.size(), prefix) == 0) set(in_block(name, to), t, gate && gated(name));
    }
  }

  void set(const std::string& key, const torch::Tensor& value, bool zero) {
    const auto it = target_.find(key);
    if (it == target_.end()) {
      throw GrowthError(fmt::format("model_growth.pretrained_ckpt_path: '{}' has {}, which model.model has no place "
                                    "for (as upstream's strict load); grow a checkpoint of the same model family",
                                    o_.source, key));
    }
    if (it->second.sizes() != value.sizes()) {
      throw GrowthError(fmt::format("model_growth.pretrained_ckpt_path: {} in '{}' is {}, the model's is {}", key,
                                    o_.source, fmt::join(value.sizes(), "x"), fmt::join(it->second.sizes(), "x")));
    }
    it->second = zero ? torch::zeros_like(it->second) : value.to(it->second.dtype());
    ++report_.copied;
  }

  const torch::Tensor& source_at(const std::string& key) const {
    const auto it = source_.find(key);
    if (it == source_.end()) {
      throw GrowthError(fmt::format("model_growth.pretrained_ckpt_path: '{}' has no {}", o_.source, key));
    }
    return it->second;
  }

  // The target's tensors of block `i`, in the model's order.
  template <class F>
  void for_block(int64_t i, F&& f) {
    for (const auto& key : order_) {
      if (block_of(key) != i) continue;
      torch::Tensor& t = target_.at(key);
      f(key, t);
      ++report_.initialised;
    }
  }

  torch::Tensor draw(const torch::Tensor& like) { return torch::randn(like.sizes(), gen_, like.options()); }

  // upstream's init_constant, rule by rule in its order.
  torch::Tensor constant(const std::string& key, const torch::Tensor& t) {
    if (contains(key, "cross_attn.proj.weight") || contains(key, "attn.proj.weight") ||
        contains(key, "mlp.point_conv.conv.weight")) {
      return draw(t) * o_.scale_spec;
    }
    if (contains(key, "q_norm.weight") || contains(key, "k_norm.weight")) return torch::ones_like(t);
    if (contains(key, "attn.proj.bias") || contains(key, "cross_attn.q_linear.bias") ||
        contains(key, "cross_attn.kv_linear.bias") || contains(key, "cross_attn.proj.bias")) {
      return torch::zeros_like(t);
    }
    if (contains(key, "mlp.depth_conv.conv.weight") || contains(key, "mlp.depth_conv.conv.bias")) {
      return draw(t) * 0.2;
    }
    return draw(t) * o_.scale_others;
  }

  const GrowthOptions& o_;
  std::map<std::string, torch::Tensor> source_;
  std::vector<std::string> order_;
  std::map<std::string, torch::Tensor> target_;
  at::Generator gen_;
  GrowthReport report_;
};

}  // namespace

std::string GrowthReport::summary() const {
  return fmt::format("{} tensors copied from a {}-block checkpoint, {} tensors of new blocks initialised", copied,
                     source_blocks, initialised);
}

GrowthReport grow_model(torch::nn::Module& model, const GrowthOptions& options) {
  Grower g(model, options);
  const GrowthReport report = g.run();
  g.write_into(model);
  return report;
}

}  // namespace sana::model
