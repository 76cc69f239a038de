// SanaMS's initial weights, drawn from one seeded CPU generator (so every rank and every
// device starts from the same weights), in upstream's scheme.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "sana/model/sana_ms.h"

namespace sana::model {

void SanaMSImpl::initialize(uint64_t seed) {
  // As upstream's SanaMS.initialize: every Linear xavier-uniform with zero bias; the patch
  // embedding xavier-uniform over its flattened kernel; the timestep and caption MLPs
  // N(0, 0.02); convolutions PyTorch's default; modulation tables randn / sqrt(C).
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  auto uniform = [&](torch::Tensor& t, double bound) {
    t.copy_(torch::empty(t.sizes(), t.options().device(torch::kCPU)).uniform_(-bound, bound, gen));
  };
  auto normal = [&](torch::Tensor& t, double std) {
    t.copy_(torch::empty(t.sizes(), t.options().device(torch::kCPU)).normal_(0, std, gen));
  };
  for (auto& item : named_modules("", /*include_self=*/false)) {
    if (item.key().rfind("controlnet.", 0) == 0) continue;  // copied from the blocks below
    if (auto* lin = item.value()->as<LinearImpl>()) {
      const double fan_in = static_cast<double>(lin->weight.size(1));
      const double fan_out = static_cast<double>(lin->weight.size(0));
      uniform(lin->weight, std::sqrt(6.0 / (fan_in + fan_out)));
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* conv = item.value()->as<Conv2dImpl>()) {
      const double fan_in = static_cast<double>(conv->weight[0].numel());
      uniform(conv->weight, 1.0 / std::sqrt(fan_in));  // kaiming_uniform(a=sqrt(5))
      if (conv->bias.defined()) uniform(conv->bias, 1.0 / std::sqrt(fan_in));
    }
  }
  auto& pw = x_embedder->proj->weight;
  uniform(pw, std::sqrt(6.0 / static_cast<double>(pw[0].numel() + pw.size(0))));
  for (auto& p : t_embedder->mlp->named_parameters()) {
    if (p.key().find("weight") != std::string::npos) normal(p.value(), 0.02);
  }
  normal(t_block->named_parameters()["1.weight"], 0.02);
  if (cfg_embedder) {  // as upstream's initialize: the guidance embedding starts at zero
    normal(cfg_embedder->mlp->first->weight, 0.02);
    cfg_embedder->mlp->second->weight.zero_();
    cfg_embedder->mlp->second->bias.zero_();
  }
  const double inv_sqrt_c = 1.0 / std::sqrt(static_cast<double>(spec_.hidden));
  for (auto& b : *blocks) {
    auto& table = b->as<SanaMSBlockImpl>()->scale_shift_table;
    normal(table, inv_sqrt_c);
  }
  normal(final_layer->scale_shift_table, inv_sqrt_c);
  if (caption_embedder) {
    normal(caption_embedder->y_proj->fc1->weight, 0.02);
    normal(caption_embedder->y_proj->fc2->weight, 0.02);
    normal(caption_embedder->y_embedding, 1.0 / std::sqrt(static_cast<double>(spec_.caption_channels)));
  }
  if (label_embedder) normal(label_embedder->embedding_table->weight, 0.02);
  copy_control_blocks();  // ControlNet: no draws of its own, so the base is the plain model's
}

}  // namespace sana::model
