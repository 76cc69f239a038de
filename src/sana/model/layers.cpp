// The model's small layers (sana_ms.h): Linear and Conv2d, which code outside the model may
// wrap (LayerHost), RMSNorm, and the FLOP trace the products report to.
#include <fmt/format.h>

#include <stdexcept>

#include "sana/model/sana_ms.h"

namespace sana::model {

namespace {

thread_local FlopTrace* g_trace = nullptr;
thread_local bool g_device_products = false;

torch::Tensor empty_parameter(at::IntArrayRef shape, const torch::TensorOptions& options) {
  return torch::empty(shape, options);
}

}  // namespace

// x [..., in] times weight [out, in]^T, + bias. On several CPU threads a product of many
// rows runs as a 1x1 convolution of the channels-last [1, in, rows, 1] view of x, which
// ATen gives to oneDNN on its own thread pool; torch::linear would call OpenBLAS, which
// sana-train keeps at one thread because its separate pool contends with ATen's for the
// cores (dist::set_compute_threads). SanaMS_tiny_P2_D4's GLUMBConv products, forward and
// backward on 2 threads: 24 ms this way, 34 through OpenBLAS's own threads.
torch::Tensor token_product(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const bool threaded = !g_device_products && x.is_cpu() && x.scalar_type() == torch::kFloat32 &&
                        at::get_num_threads() > 1 && x.numel() >= (int64_t{1} << 16);
  if (!threaded) return torch::linear(x, weight, bias);
  const int64_t in = x.size(-1), rows = x.numel() / in;
  const auto y = torch::conv2d(x.reshape({1, rows, 1, in}).permute({0, 3, 1, 2}),
                               weight.reshape({weight.size(0), in, 1, 1}), bias);
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return y.permute({0, 2, 3, 1}).reshape(sizes);
}

DeviceProducts::DeviceProducts() : outer_(g_device_products) { g_device_products = true; }
DeviceProducts::~DeviceProducts() { g_device_products = outer_; }

bool FlopTrace::active() { return g_trace != nullptr; }
FlopTrace::FlopTrace() : outer_(g_trace) { g_trace = this; }
FlopTrace::~FlopTrace() { g_trace = outer_; }
void FlopTrace::add(double flops) {
  for (FlopTrace* t = g_trace; t != nullptr; t = t->outer_) t->flops_ += flops;
}

void LayerHost::replace_layer(const std::string& name, std::shared_ptr<torch::nn::Module> replacement) {
  const auto it = replacers_.find(name);
  if (it == replacers_.end()) {
    throw std::logic_error(fmt::format("{} has no replaceable layer '{}'", this->name(), name));
  }
  if (!it->second(std::move(replacement))) {
    throw std::logic_error(fmt::format("{}: '{}' can only be replaced by a module derived from its type", this->name(), name));
  }
}

std::shared_ptr<torch::nn::Module> replace_layer(torch::nn::Module& root, const std::string& path,
                                                 std::shared_ptr<torch::nn::Module> replacement) {
  const auto dot = path.rfind('.');
  const std::string parent_path = dot == std::string::npos ? "" : path.substr(0, dot);
  const std::string child = dot == std::string::npos ? path : path.substr(dot + 1);
  torch::nn::Module* parent = &root;
  if (!parent_path.empty()) {
    const auto modules = root.named_modules("", /*include_self=*/false);
    if (!modules.contains(parent_path)) throw std::logic_error(fmt::format("no module '{}'", parent_path));
    parent = modules[parent_path].get();
  }
  auto* host = dynamic_cast<LayerHost*>(parent);
  if (host == nullptr) throw std::logic_error(fmt::format("'{}' holds no replaceable layers", parent_path));
  const auto children = parent->named_children();
  const auto* previous = children.find(child);
  if (previous == nullptr) throw std::logic_error(fmt::format("'{}' has no layer '{}'", parent_path, child));
  auto replaced = *previous;
  host->replace_layer(child, std::move(replacement));
  return replaced;
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, const torch::TensorOptions& o) {
  weight = register_parameter("weight", empty_parameter({out, in}, o));
  if (with_bias) bias = register_parameter("bias", empty_parameter({out}, o));
}

namespace {

// Registers every parameter `base` registers itself into `into`, under the same names.
void adopt_parameters(torch::nn::Module& into, const torch::nn::Module& base) {
  for (const auto& p : base.named_parameters(/*recurse=*/false)) {
    into.register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
  into.train(base.is_training());
}

}  // namespace

LinearImpl::LinearImpl(const LinearImpl& base) : torch::nn::Module(), weight(base.weight), bias(base.bias) {
  adopt_parameters(*this, base);
}

LinearImpl::LinearImpl(const torch::Tensor& weight_, const torch::Tensor& bias_) {
  weight = register_parameter("weight", weight_, weight_.requires_grad());
  if (bias_.defined()) bias = register_parameter("bias", bias_, bias_.requires_grad());
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (g_trace) FlopTrace::add(2.0 * static_cast<double>(x.numel()) * static_cast<double>(weight.size(0)));
  return token_product(x, product_weight(), bias);
}

Conv2dImpl::Conv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
                       int64_t groups_, bool with_bias, const torch::TensorOptions& o)
    : stride(stride_), padding(padding_), groups(groups_) {
  weight = register_parameter("weight", empty_parameter({out, in / groups_, kernel, kernel}, o));
  if (with_bias) bias = register_parameter("bias", empty_parameter({out}, o));
}

Conv2dImpl::Conv2dImpl(const Conv2dImpl& base)
    : torch::nn::Module(), weight(base.weight), bias(base.bias), stride(base.stride), padding(base.padding),
      groups(base.groups) {
  adopt_parameters(*this, base);
}

Conv2dImpl::Conv2dImpl(const torch::Tensor& weight_, const torch::Tensor& bias_, int64_t stride_, int64_t padding_,
                       int64_t groups_)
    : stride(stride_), padding(padding_), groups(groups_) {
  weight = register_parameter("weight", weight_, weight_.requires_grad());
  if (bias_.defined()) bias = register_parameter("bias", bias_, bias_.requires_grad());
}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& x) {
  auto y = torch::conv2d(x, product_weight(), bias, stride, padding, 1, groups);
  if (g_trace) {
    FlopTrace::add(2.0 * static_cast<double>(y.numel()) *
                   static_cast<double>(weight.size(1) * weight.size(2) * weight.size(3)));
  }
  return y;
}

torch::Tensor Conv2dImpl::forward_tokens(const torch::Tensor& x, int64_t /*h*/, int64_t /*w*/) {
  TORCH_CHECK(weight.size(2) == 1 && weight.size(3) == 1 && stride == 1 && padding == 0 && groups == 1,
              "forward_tokens is for 1x1 convolutions, this one has weight ", weight.sizes());
  if (g_trace) FlopTrace::add(2.0 * static_cast<double>(x.numel()) * static_cast<double>(weight.size(0)));
  return token_product(x, product_weight().flatten(1), bias);
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
