#include "sana/model/frozen_storage.h"

#include <torch/autograd.h>

#include <algorithm>
#include <map>

#include "sana/model/autocast.h"

namespace sana::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::ScalarType torch_dtype(StorageDtype d) {
  switch (d) {
    case StorageDtype::bf16: return torch::kBFloat16;
    case StorageDtype::fp16: return torch::kHalf;
    case StorageDtype::int8: return torch::kChar;
    case StorageDtype::fp32: break;
  }
  return torch::kFloat32;
}

// A custom autograd function takes defined tensors only: an empty one stands for none (a
// scale under bf16 / fp16, a layer's bias it does not have).
// One shared empty tensor: no allocation per forward.
torch::Tensor or_none(const torch::Tensor& t) {
  static const torch::Tensor none = torch::empty({0});
  return t.defined() ? t : none;
}
bool given(const torch::Tensor& t) { return t.numel() > 0; }

// The stored weight in `dtype`: int8 codes times their scales, or a cast.
torch::Tensor restore(const torch::Tensor& stored, const torch::Tensor& scale, torch::ScalarType dtype) {
  return given(scale) ? dequantize_int8(stored, scale, dtype) : stored.to(dtype);
}

// What a stored layer computes in: its input's dtype, or autocast's on CUDA.
torch::ScalarType compute_dtype(const torch::Tensor& x) {
  const auto autocast = AutocastState::current();
  return autocast.enabled && x.is_cuda() ? autocast.dtype : x.scalar_type();
}

// x [..., in] times the restored weight [out, in]^T (+ bias); the backward restores it again.
struct StoredProduct : public torch::autograd::Function<StoredProduct> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& stored,
                               const torch::Tensor& scale, const torch::Tensor& bias) {
    ctx->save_for_backward({stored, scale});
    const auto dtype = compute_dtype(x);
    const auto b = given(bias) ? bias.to(dtype) : torch::Tensor();
    return token_product(x.to(dtype), restore(stored, scale, dtype), b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& dy = grads[0];
    // dx = dy W: dy times (W^T)^T, the same product as the forward's.
    const auto w = restore(saved[0], saved[1], dy.scalar_type());
    return {token_product(dy, w.t().contiguous(), torch::Tensor()), {}, {}, {}};
  }
};

// A convolution with the restored weight; the backward gives the input its gradient only.
struct StoredConvolution : public torch::autograd::Function<StoredConvolution> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& stored,
                               const torch::Tensor& scale, const torch::Tensor& bias, int64_t stride, int64_t padding,
                               int64_t groups) {
    const auto dtype = compute_dtype(x);
    const auto input = x.to(dtype);
    ctx->save_for_backward({stored, scale, input});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["groups"] = groups;
    const auto b = given(bias) ? bias.to(dtype) : torch::Tensor();
    return torch::conv2d(input, restore(stored, scale, dtype), b, stride, padding, 1, groups);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& dy = grads[0];
    const int64_t stride = ctx->saved_data["stride"].toInt(), padding = ctx->saved_data["padding"].toInt();
    const auto w = restore(saved[0], saved[1], dy.scalar_type());
    const auto dx = std::get<0>(at::convolution_backward(dy, saved[2].to(dy.scalar_type()), w, c10::nullopt,
                                                         {stride, stride}, {padding, padding}, {1, 1}, false, {0, 0},
                                                         ctx->saved_data["groups"].toInt(), {true, false, false}));
    return {dx, {}, {}, {}, {}, {}, {}};
  }
};

double product_flops(const torch::Tensor& x, const torch::Tensor& weight) {
  return 2.0 * static_cast<double>(x.numel()) * static_cast<double>(weight.size(0));
}

// (weight, scale) as `dtype` stores them: meta tensors for a meta weight.
std::pair<torch::Tensor, torch::Tensor> stored_form(const torch::Tensor& weight, StorageDtype dtype) {
  torch::NoGradGuard no_grad;
  if (dtype != StorageDtype::int8) return {weight.to(torch_dtype(dtype)), torch::Tensor()};
  if (weight.is_meta()) {
    return {torch::empty(weight.sizes(), weight.options().dtype(torch::kChar)),
            torch::empty({weight.size(0)}, weight.options().dtype(torch::kFloat32))};
  }
  return quantize_int8(weight);
}

// What a stored layer keeps besides its weight: the dtype it is stored in, the dtype it
// computes in (the weight's before), and int8's scales, registered as "weight_scale".
struct Storage {
  Storage(torch::nn::Module& layer, StorageDtype dtype_, torch::ScalarType compute_, const torch::Tensor& scale_)
      : dtype(dtype_), compute(compute_) {
    if (scale_.defined()) scale = layer.register_parameter("weight_scale", scale_, false);
  }
  StorageDtype dtype;
  torch::ScalarType compute;
  torch::Tensor scale;
};

class StoredLinearImpl : public LinearImpl {
 public:
  StoredLinearImpl(const LinearImpl& base, StorageDtype dtype, const std::pair<torch::Tensor, torch::Tensor>& stored)
      : LinearImpl(stored.first, base.bias), storage_(*this, dtype, base.compute_dtype(), stored.second) {
    train(base.is_training());
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    if (FlopTrace::active()) FlopTrace::add(product_flops(x, weight));
    return StoredProduct::apply(x, weight, or_none(storage_.scale), or_none(bias));
  }
  torch::ScalarType compute_dtype() const override { return storage_.compute; }
  const Storage& storage() const { return storage_; }

 private:
  Storage storage_;
};

class StoredConv2dImpl : public Conv2dImpl {
 public:
  StoredConv2dImpl(const Conv2dImpl& base, StorageDtype dtype, const std::pair<torch::Tensor, torch::Tensor>& stored)
      : Conv2dImpl(stored.first, base.bias, base.stride, base.padding, base.groups),
        storage_(*this, dtype, base.compute_dtype(), stored.second) {
    train(base.is_training());
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = StoredConvolution::apply(x, weight, or_none(storage_.scale), or_none(bias), stride, padding, groups);
    if (FlopTrace::active()) {
      FlopTrace::add(2.0 * static_cast<double>(y.numel()) *
                     static_cast<double>(weight.size(1) * weight.size(2) * weight.size(3)));
    }
    return y;
  }
  torch::Tensor forward_tokens(const torch::Tensor& x, int64_t /*h*/, int64_t /*w*/) override {
    TORCH_CHECK(weight.size(2) == 1 && weight.size(3) == 1 && stride == 1 && padding == 0 && groups == 1,
                "forward_tokens is for 1x1 convolutions, this one has weight ", weight.sizes());
    if (FlopTrace::active()) FlopTrace::add(product_flops(x, weight));
    return StoredProduct::apply(x, weight.flatten(1), or_none(storage_.scale), or_none(bias));
  }
  torch::ScalarType compute_dtype() const override { return storage_.compute; }
  const Storage& storage() const { return storage_; }

 private:
  Storage storage_;
};

}  // namespace

std::pair<torch::Tensor, torch::Tensor> quantize_int8(const torch::Tensor& weight) {
  torch::NoGradGuard no_grad;
  const auto rows = weight.detach().to(torch::kFloat32).flatten(1);
  auto scale = rows.abs().amax(1) / 127.0;
  scale = torch::where(scale > 0, scale, torch::ones_like(scale));
  const auto q = torch::round(rows / scale.unsqueeze(1)).clamp(-127, 127).to(torch::kChar);
  return {q.view(weight.sizes()), scale};
}

torch::Tensor dequantize_int8(const torch::Tensor& q, const torch::Tensor& scale, torch::ScalarType dtype) {
  std::vector<int64_t> shape(static_cast<size_t>(q.dim()), 1);
  shape[0] = q.size(0);
  return q.to(dtype) * scale.to(dtype).view(shape);
}

StorageReport store_frozen_layers(SanaMSImpl& model, StorageDtype dtype,
                                  const std::function<bool(const std::string& layer)>& frozen) {
  StorageReport report;
  if (dtype == StorageDtype::fp32) return report;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> chosen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (!frozen(item.key())) continue;
    if (item.value()->as<LinearImpl>() == nullptr && item.value()->as<Conv2dImpl>() == nullptr) continue;
    chosen.emplace_back(item.key(), item.value());
  }
  for (auto& [path, module] : chosen) {  // one layer at a time: each full-precision weight goes as it is stored
    const auto bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
    std::shared_ptr<torch::nn::Module> stored;
    torch::Tensor weight;
    std::pair<torch::Tensor, torch::Tensor> form;
    if (auto* linear = module->as<LinearImpl>()) {
      weight = linear->weight;
      TORCH_CHECK(!weight.requires_grad(), "store_frozen_layers: ", path, " trains");
      form = stored_form(weight, dtype);
      stored = std::make_shared<StoredLinearImpl>(*linear, dtype, form);
    } else {
      auto* conv = module->as<Conv2dImpl>();
      weight = conv->weight;
      TORCH_CHECK(!weight.requires_grad(), "store_frozen_layers: ", path, " trains");
      form = stored_form(weight, dtype);
      stored = std::make_shared<StoredConv2dImpl>(*conv, dtype, form);
    }
    report.layers += 1;
    report.bytes_before += bytes(weight);
    report.bytes_after += bytes(form.first) + bytes(form.second);
    report.largest = std::max(report.largest, weight.numel());
    replace_layer(model, path, stored);
    module.reset();
  }
  return report;
}

std::vector<std::pair<std::string, torch::Tensor>> restored_tensors(const SanaMSImpl& model) {
  torch::NoGradGuard no_grad;
  std::map<std::string, const Storage*> stored;  // layer path -> its storage
  std::map<std::string, torch::Tensor> weights;  // layer path -> its stored weight
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (const auto* l = dynamic_cast<const StoredLinearImpl*>(item.value().get())) {
      stored[item.key()] = &l->storage();
      weights[item.key()] = l->weight;
    } else if (const auto* c = dynamic_cast<const StoredConv2dImpl*>(item.value().get())) {
      stored[item.key()] = &c->storage();
      weights[item.key()] = c->weight;
    }
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto add = [&](const std::string& name, const torch::Tensor& t) {
    const auto dot = name.rfind('.');
    const auto it = dot == std::string::npos ? stored.end() : stored.find(name.substr(0, dot));
    const auto field = it == stored.end() ? std::string() : name.substr(dot + 1);
    if (field == "weight") {
      const auto& s = *it->second;
      out.emplace_back(name, restore(weights[it->first], or_none(s.scale), s.compute));
    } else if (field != "weight_scale") {  // the scales are folded into the weight
      out.emplace_back(name, t);
    }
  };
  for (const auto& p : model.named_parameters()) add(p.key(), p.value());
  for (const auto& b : model.named_buffers()) add(b.key(), b.value());
  return out;
}

StorageDtype frozen_storage_dtype(const SanaMSImpl& model) {
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (const auto* l = dynamic_cast<const StoredLinearImpl*>(m.get())) return l->storage().dtype;
    if (const auto* c = dynamic_cast<const StoredConv2dImpl*>(m.get())) return c->storage().dtype;
  }
  return StorageDtype::fp32;
}

}  // namespace sana::model
