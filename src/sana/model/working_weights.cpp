#include "sana/model/working_weights.h"

#include "sana/model/sana_ms.h"
#include "sana/torch_compat.h"

namespace sana::model {

namespace {

// The half dtype autocast would cast a float tensor on `device` to, or kFloat where it is off.
at::ScalarType autocast_target(const torch::Device& device) {
  if (device.is_cuda() && compat::cuda_autocast_enabled()) return compat::cuda_autocast_dtype();
  if (device.is_cpu() && compat::cpu_autocast_enabled()) return compat::cpu_autocast_dtype();
  return at::kFloat;
}

// The half copy in place of `weight` in the graph: its gradient reaches `weight` converted to
// the weight's dtype, as through autocast's own cast (aten::_to_copy's backward).
struct WorkingCast : public torch::autograd::Function<WorkingCast> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& weight,
                               const torch::Tensor& half) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return half;  // an input returned: autograd gives the graph a view of it
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0].defined() ? grads[0].to(dtype) : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor WorkingCopy::of(const torch::Tensor& weight) {
  if (!weight.defined() || weight.scalar_type() != at::kFloat || !weight.requires_grad()) return weight;
  const auto half = autocast_target(weight.device());
  if (half == at::kFloat) return weight;
  torch::Tensor copy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool fresh = half_.defined() && half_.scalar_type() == half && data_ == weight.data_ptr() &&
                       version_ == static_cast<int64_t>(weight._version());
    if (!fresh) {
      torch::NoGradGuard no_grad;
      half_ = weight.detach().to(half);  // a new tensor: a graph still holding the old one keeps it
      data_ = weight.data_ptr();
      version_ = static_cast<int64_t>(weight._version());
      ++casts_;
    }
    copy = half_;
  }
  if (!torch::GradMode::is_enabled()) return copy;
  return WorkingCast::apply(weight, copy);
}

int64_t use_working_weights(torch::nn::Module& root, bool on) {
  int64_t layers = 0;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    std::shared_ptr<WorkingCopy>* slot = nullptr;
    const torch::Tensor* weight = nullptr;
    if (auto* linear = dynamic_cast<LinearImpl*>(module.get())) {
      slot = &linear->working;
      weight = &linear->weight;
    } else if (auto* conv = dynamic_cast<Conv2dImpl*>(module.get())) {
      slot = &conv->working;
      weight = &conv->weight;
    }
    if (slot == nullptr) continue;
    const bool wanted = on && weight->defined() && weight->requires_grad() && weight->scalar_type() == at::kFloat;
    if (!wanted) {
      slot->reset();
      continue;
    }
    if (!*slot) *slot = std::make_shared<WorkingCopy>();
    ++layers;
  }
  return layers;
}

WorkingWeightsUse working_weights_use(torch::nn::Module& root) {
  WorkingWeightsUse use;
  auto count = [&](const std::shared_ptr<WorkingCopy>& copy) {
    if (!copy) return;
    ++use.layers;
    use.casts += copy->casts();
    use.bytes += copy->bytes();
  };
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* linear = dynamic_cast<LinearImpl*>(module.get())) count(linear->working);
    if (auto* conv = dynamic_cast<Conv2dImpl*>(module.get())) count(conv->working);
  }
  return use;
}

int64_t working_elements(torch::nn::Module& root, const std::function<bool(const std::string& layer)>& trains) {
  int64_t n = 0;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (!trains(item.key())) continue;
    if (auto* linear = dynamic_cast<LinearImpl*>(item.value().get())) n += linear->weight.numel();
    if (auto* conv = dynamic_cast<Conv2dImpl*>(item.value().get())) n += conv->weight.numel();
  }
  return n;
}

}  // namespace sana::model
