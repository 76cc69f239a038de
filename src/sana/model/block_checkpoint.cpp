// Gradient checkpointing of a SanaMS block (SanaMSImpl::run_block): the forward keeps only
// the block's inputs, the backward runs the block again with autograd on, under the same
// autocast, and differentiates that.
#include "sana/model/autocast.h"
#include "sana/model/sana_ms.h"

namespace sana::model {

namespace {

// Gradient checkpointing of one block: the forward keeps only the block's inputs; the
// backward runs the block again with autograd on and differentiates that.
struct CheckpointBlock : public torch::autograd::Function<CheckpointBlock> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, SanaMSBlockImpl* block, const torch::Tensor& x,
      const compat::optional<torch::Tensor>& y, const torch::Tensor& t0,
      const compat::optional<torch::Tensor>& bias, int64_t h, int64_t w, at::TensorList params) {
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    ctx->saved_data["h"] = h;
    ctx->saved_data["w"] = w;
    ctx->saved_data["x"] = x.detach();
    ctx->saved_data["t0"] = t0.detach();
    ctx->saved_data["x_grad"] = x.requires_grad();
    ctx->saved_data["t0_grad"] = t0.requires_grad();
    ctx->saved_data["has_y"] = y.has_value();
    if (y) {
      ctx->saved_data["y"] = y->detach();
      ctx->saved_data["y_grad"] = y->requires_grad();
    }
    ctx->saved_data["has_bias"] = bias.has_value();
    if (bias) ctx->saved_data["bias"] = bias->detach();
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    const auto amp = AutocastState::current();  // the recompute runs under the same autocast
    ctx->saved_data["amp"] = amp.enabled;
    ctx->saved_data["amp_dtype"] = static_cast<int64_t>(amp.dtype);
    ctx->saved_data["cpu_amp"] = amp.cpu_enabled;
    ctx->saved_data["cpu_amp_dtype"] = static_cast<int64_t>(amp.cpu_dtype);
    return {block->forward(x, y ? *y : torch::Tensor(), t0, bias ? *bias : torch::Tensor(), h, w)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& d = ctx->saved_data;
    auto* block = reinterpret_cast<SanaMSBlockImpl*>(d["block"].toInt());
    const bool has_y = d["has_y"].toBool(), has_bias = d["has_bias"].toBool();
    auto x = d["x"].toTensor().detach().requires_grad_(d["x_grad"].toBool());
    auto t0 = d["t0"].toTensor().detach().requires_grad_(d["t0_grad"].toBool());
    torch::Tensor y, bias;
    if (has_y) y = d["y"].toTensor().detach().requires_grad_(d["y_grad"].toBool());
    if (has_bias) bias = d["bias"].toTensor();
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      AutocastGuard amp(AutocastState{d["amp"].toBool(), static_cast<at::ScalarType>(d["amp_dtype"].toInt()),
                                      d["cpu_amp"].toBool(), static_cast<at::ScalarType>(d["cpu_amp_dtype"].toInt())});
      out = block->forward(x, y, t0, bias, d["h"].toInt(), d["w"].toInt());
    }
    std::vector<torch::Tensor> inputs;
    std::vector<size_t> slot;  // position of each differentiated input in the result
    torch::autograd::variable_list result(1 + 3 + 1 + 2 + static_cast<size_t>(d["params"].toInt()));
    auto want = [&](const torch::Tensor& t, size_t pos) {
      if (t.defined() && t.requires_grad()) {
        inputs.push_back(t);
        slot.push_back(pos);
      }
    };
    want(x, 1);
    if (has_y) want(y, 2);
    want(t0, 3);
    size_t pos = 7;
    for (const auto& p : block->differentiable()) want(p, pos++);
    if (inputs.empty()) return result;
    const auto g = torch::autograd::grad({out}, inputs, {grads[0]}, false, false, true);
    for (size_t i = 0; i < g.size(); ++i) {
      // A trained parameter the block did not use gets a zero gradient, not none: its
      // accumulator then runs, and so do the gradient hooks the trainer counts on
      // (parallel/accumulator_hooks.h: a tensor's hooks run only for a gradient).
      result[slot[i]] = g[i].defined() || slot[i] < 7 ? g[i] : torch::zeros_like(inputs[i]);
    }
    return result;
  }
};

}  // namespace

torch::Tensor SanaMSImpl::run_block(SanaMSBlockImpl* block, const torch::Tensor& x, const torch::Tensor& y,
                                    const torch::Tensor& t0, const torch::Tensor& bias, int64_t h, int64_t w,
                                    bool checkpoint) {
  if (!checkpoint) return block->forward(x, y, t0, bias, h, w);
  const auto params = block->differentiable();
  return CheckpointBlock::apply(block, x, y.defined() ? compat::optional<torch::Tensor>(y) : c10::nullopt, t0,
                                bias.defined() ? compat::optional<torch::Tensor>(bias) : c10::nullopt, h, w,
                                at::TensorList(params))[0];
}

}  // namespace sana::model
