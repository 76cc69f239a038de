// Upstream's ControlNet on SanaMS (sana_multi_scale_controlnet.py): the control blocks and
// their start; SanaMSImpl::forward runs them (sana_ms.cpp).
#include "sana/model/sana_ms.h"

namespace sana::model {

ControlSanaMSBlockImpl::ControlSanaMSBlockImpl(const ModelSpec& spec, int64_t index_, const torch::TensorOptions& o)
    : index(index_) {
  copied_block = register_module("copied_block", SanaMSBlock(spec, o));
  if (index == 0) before_proj = register_module("before_proj", Linear(spec.hidden, spec.hidden, true, o));
  after_proj = register_module("after_proj", Linear(spec.hidden, spec.hidden, true, o));
}

void SanaMSImpl::copy_control_blocks() {
  if (!controlnet) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < controlnet->size(); ++i) {
    auto* cb = controlnet[i]->as<ControlSanaMSBlockImpl>();
    const auto base = blocks[i]->named_parameters();
    for (auto& p : cb->copied_block->named_parameters()) p.value().copy_(base[p.key()]);
    for (auto* proj : {cb->before_proj ? cb->before_proj.get() : nullptr, cb->after_proj.get()}) {
      if (proj == nullptr) continue;  // before_proj: the first block's alone
      proj->weight.zero_();
      proj->bias.zero_();
    }
  }
}

}  // namespace sana::model
