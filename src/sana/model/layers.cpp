// The model's small layers (sana_ms.h): Linear and Conv2d with an optional adapter
// (LayerAdapter, model/lora.h), RMSNorm, and the FLOP trace the products report to.
#include "sana/model/sana_ms.h"

namespace sana::model {

namespace {

thread_local FlopTrace* g_trace = nullptr;

torch::Tensor empty_parameter(at::IntArrayRef shape, const torch::TensorOptions& options) {
  return torch::empty(shape, options);
}

}  // namespace

bool FlopTrace::active() { return g_trace != nullptr; }
FlopTrace::FlopTrace() : outer_(g_trace) { g_trace = this; }
FlopTrace::~FlopTrace() { g_trace = outer_; }
void FlopTrace::add(double flops) {
  for (FlopTrace* t = g_trace; t != nullptr; t = t->outer_) t->flops_ += flops;
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, const torch::TensorOptions& o) {
  weight = register_parameter("weight", empty_parameter({out, in}, o));
  if (with_bias) bias = register_parameter("bias", empty_parameter({out}, o));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (g_trace) FlopTrace::add(2.0 * static_cast<double>(x.numel()) * static_cast<double>(weight.size(0)));
  auto y = torch::linear(x, weight, bias);
  return adapter ? y + adapter->delta(x, is_training()) : y;
}

Conv2dImpl::Conv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
                       int64_t groups_, bool with_bias, const torch::TensorOptions& o)
    : stride(stride_), padding(padding_), groups(groups_) {
  weight = register_parameter("weight", empty_parameter({out, in / groups_, kernel, kernel}, o));
  if (with_bias) bias = register_parameter("bias", empty_parameter({out}, o));
}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& x) {
  auto y = torch::conv2d(x, weight, bias, stride, padding, 1, groups);
  if (g_trace) {
    FlopTrace::add(2.0 * static_cast<double>(y.numel()) *
                   static_cast<double>(weight.size(1) * weight.size(2) * weight.size(3)));
  }
  return adapter ? y + adapter->delta(x, is_training()) : y;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double scale, double eps_, const torch::TensorOptions& o)
    : eps(eps_) {
  weight = register_parameter("weight", empty_parameter({dim}, o));
  if (!o.device().is_meta()) {
    torch::NoGradGuard no_grad;
    weight.fill_(scale);
  }
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  const auto xf = x.to(x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
  const auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
  // As upstream's norms.RMSNorm: the weight multiplies in fp32, then the cast.
  return (normed * weight).to(x.scalar_type());
}

}  // namespace sana::model
