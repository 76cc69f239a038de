#include "sana/model/frozen_storage.h"

#include <torch/autograd.h>

#include <algorithm>
#include <map>
#include <optional>

#include "sana/model/autocast.h"

namespace sana::model {

namespace {

// A custom autograd function takes defined tensors only: an empty one stands for none (what
// a dtype does not keep, a layer's bias it does not have).
// One shared empty tensor: no allocation per forward.
torch::Tensor or_none(const torch::Tensor& t) {
  static const torch::Tensor none = torch::empty({0});
  return t.defined() ? t : none;
}
bool given(const torch::Tensor& t) { return t.numel() > 0; }
torch::Tensor defined_or_not(const torch::Tensor& t) { return given(t) ? t : torch::Tensor(); }

// What a stored layer computes in: its input's dtype, or autocast's on CUDA.
torch::ScalarType compute_dtype(const torch::Tensor& x) {
  const auto autocast = AutocastState::current();
  return autocast.enabled && x.is_cuda() ? autocast.dtype : x.scalar_type();
}

// A stored weight as an autograd function's inputs and saved state take it: its tensors
// (or_none for those it lacks) and, as integers, its dtype and shape.
std::vector<torch::Tensor> tensors_of(const StoredWeight& w) {
  return {w.codes, or_none(w.scale), or_none(w.absmax), or_none(w.nested_absmax), or_none(w.offset)};
}
StoredWeight stored_from(const variable_list& t, int64_t dtype, std::vector<int64_t> shape) {
  StoredWeight w;
  w.dtype = static_cast<StorageDtype>(dtype);
  w.shape = std::move(shape);
  w.codes = t[0];
  w.scale = defined_or_not(t[1]);
  w.absmax = defined_or_not(t[2]);
  w.nested_absmax = defined_or_not(t[3]);
  w.offset = defined_or_not(t[4]);
  return w;
}
void save_layout(AutogradContext* ctx, int64_t dtype, const std::vector<int64_t>& shape,
                 const std::vector<int64_t>& product) {
  ctx->saved_data["dtype"] = dtype;
  ctx->saved_data["shape"] = shape;
  ctx->saved_data["product"] = product;
}
// The saved weight restored in `dtype`, of the shape its product takes.
torch::Tensor restored_saved(AutogradContext* ctx, const variable_list& saved, torch::ScalarType dtype) {
  const auto w = stored_from(saved, ctx->saved_data["dtype"].toInt(), ctx->saved_data["shape"].toIntVector());
  return restore_weight(w, dtype).view(ctx->saved_data["product"].toIntVector());
}

// x [..., in] times the restored weight [out, in]^T (+ bias); the backward restores it again.
// `product` is the weight's shape as the product takes it ([out, in], a 1x1 convolution's
// flattened).
struct StoredProduct : public torch::autograd::Function<StoredProduct> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& codes,
                               const torch::Tensor& scale, const torch::Tensor& absmax, const torch::Tensor& nested,
                               const torch::Tensor& offset, const torch::Tensor& bias, int64_t dtype,
                               std::vector<int64_t> shape, std::vector<int64_t> product) {
    ctx->save_for_backward({codes, scale, absmax, nested, offset});
    save_layout(ctx, dtype, shape, product);
    const auto compute = compute_dtype(x);
    const auto b = given(bias) ? bias.to(compute) : torch::Tensor();
    const auto w = stored_from({codes, scale, absmax, nested, offset}, dtype, std::move(shape));
    return token_product(x.to(compute), restore_weight(w, compute).view(product), b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& dy = grads[0];
    // dx = dy W: dy times (W^T)^T, the same product as the forward's.
    const auto w = restored_saved(ctx, ctx->get_saved_variables(), dy.scalar_type());
    return {token_product(dy, w.t().contiguous(), torch::Tensor()), {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

// A convolution with the restored weight; the backward gives the input its gradient only.
struct StoredConvolution : public torch::autograd::Function<StoredConvolution> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& codes,
                               const torch::Tensor& scale, const torch::Tensor& absmax, const torch::Tensor& nested,
                               const torch::Tensor& offset, const torch::Tensor& bias, int64_t dtype,
                               std::vector<int64_t> shape, int64_t stride, int64_t padding, int64_t groups) {
    const auto compute = compute_dtype(x);
    const auto input = x.to(compute);
    ctx->save_for_backward({codes, scale, absmax, nested, offset, input});
    save_layout(ctx, dtype, shape, shape);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["groups"] = groups;
    const auto b = given(bias) ? bias.to(compute) : torch::Tensor();
    const auto w = stored_from({codes, scale, absmax, nested, offset}, dtype, std::move(shape));
    return torch::conv2d(input, restore_weight(w, compute), b, stride, padding, 1, groups);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& dy = grads[0];
    const int64_t stride = ctx->saved_data["stride"].toInt(), padding = ctx->saved_data["padding"].toInt();
    const auto w = restored_saved(ctx, saved, dy.scalar_type());
    const auto dx = std::get<0>(at::convolution_backward(dy, saved[5].to(dy.scalar_type()), w, c10::nullopt,
                                                         {stride, stride}, {padding, padding}, {1, 1}, false, {0, 0},
                                                         ctx->saved_data["groups"].toInt(), {true, false, false}));
    return {dx, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

// What a stored layer keeps besides its codes (its "weight"): the dtype it is stored in,
// the weight's shape, the dtype it computes in (the weight's before), and what turns the
// codes back, registered under the names frozen_storage.h gives.
struct Storage {
  Storage(torch::nn::Module& layer, const StoredWeight& w, torch::ScalarType compute_)
      : dtype(w.dtype), shape(w.shape), compute(compute_) {
    const auto add = [&](const char* name, const torch::Tensor& t) {
      return t.defined() ? layer.register_parameter(name, t, false) : torch::Tensor();
    };
    scale = add("weight_scale", w.scale);
    absmax = add("weight_absmax", w.absmax);
    nested_absmax = add("weight_nested_absmax", w.nested_absmax);
    offset = add("weight_offset", w.offset);
  }
  StoredWeight with(const torch::Tensor& codes) const {
    return {dtype, shape, codes, scale, absmax, nested_absmax, offset};
  }
  StorageDtype dtype;
  std::vector<int64_t> shape;
  torch::ScalarType compute;
  torch::Tensor scale, absmax, nested_absmax, offset;
};

// x times the stored weight `w` (as the product takes it: `product`), through StoredProduct.
torch::Tensor stored_product(const torch::Tensor& x, const StoredWeight& w, const torch::Tensor& bias,
                             std::vector<int64_t> product) {
  const auto t = tensors_of(w);
  return StoredProduct::apply(x, t[0], t[1], t[2], t[3], t[4], or_none(bias), static_cast<int64_t>(w.dtype), w.shape,
                              std::move(product));
}

double product_flops(const torch::Tensor& x, int64_t out) {
  return 2.0 * static_cast<double>(x.numel()) * static_cast<double>(out);
}

class StoredLinearImpl : public LinearImpl {
 public:
  StoredLinearImpl(const LinearImpl& base, const StoredWeight& stored)
      : LinearImpl(stored.codes, base.bias), storage_(*this, stored, base.compute_dtype()) {
    train(base.is_training());
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    if (FlopTrace::active()) FlopTrace::add(product_flops(x, storage_.shape[0]));
    return stored_product(x, storage_.with(weight), bias, storage_.shape);
  }
  torch::ScalarType compute_dtype() const override { return storage_.compute; }
  std::vector<int64_t> weight_shape() const override { return storage_.shape; }
  StoredWeight stored() const { return storage_.with(weight); }

 private:
  Storage storage_;
};

class StoredConv2dImpl : public Conv2dImpl {
 public:
  StoredConv2dImpl(const Conv2dImpl& base, const StoredWeight& stored)
      : Conv2dImpl(stored.codes, base.bias, base.stride, base.padding, base.groups),
        storage_(*this, stored, base.compute_dtype()) {
    train(base.is_training());
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const auto w = storage_.with(weight);
    const auto t = tensors_of(w);
    auto y = StoredConvolution::apply(x, t[0], t[1], t[2], t[3], t[4], or_none(bias), static_cast<int64_t>(w.dtype),
                                      w.shape, stride, padding, groups);
    if (FlopTrace::active()) {
      FlopTrace::add(2.0 * static_cast<double>(y.numel()) * static_cast<double>(w.shape[1] * w.shape[2] * w.shape[3]));
    }
    return y;
  }
  torch::Tensor forward_tokens(const torch::Tensor& x, int64_t /*h*/, int64_t /*w*/) override {
    const auto& s = storage_.shape;
    TORCH_CHECK(s[2] == 1 && s[3] == 1 && stride == 1 && padding == 0 && groups == 1,
                "forward_tokens is for 1x1 convolutions, this one has weight ", s);
    if (FlopTrace::active()) FlopTrace::add(product_flops(x, s[0]));
    return stored_product(x, storage_.with(weight), bias, {s[0], s[1]});
  }
  torch::ScalarType compute_dtype() const override { return storage_.compute; }
  std::vector<int64_t> weight_shape() const override { return storage_.shape; }
  StoredWeight stored() const { return storage_.with(weight); }

 private:
  Storage storage_;
};


// The stored weight of a stored layer, and the dtype the layer computes in.
std::optional<std::pair<StoredWeight, torch::ScalarType>> stored_of(const torch::nn::Module& m) {
  if (const auto* l = dynamic_cast<const StoredLinearImpl*>(&m)) return std::make_pair(l->stored(), l->compute_dtype());
  if (const auto* c = dynamic_cast<const StoredConv2dImpl*>(&m)) return std::make_pair(c->stored(), c->compute_dtype());
  return std::nullopt;
}

}  // namespace

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
  const auto bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  for (auto& [path, module] : chosen) {  // one layer at a time: each full-precision weight goes as it is stored
    auto* linear = module->as<LinearImpl>();
    auto* conv = module->as<Conv2dImpl>();
    const auto weight = linear ? linear->weight : conv->weight;
    TORCH_CHECK(!weight.requires_grad(), "store_frozen_layers: ", path, " trains");
    const auto form = store_weight(weight, dtype);
    std::shared_ptr<torch::nn::Module> stored;
    if (linear) {
      stored = std::make_shared<StoredLinearImpl>(*linear, form);
    } else {
      stored = std::make_shared<StoredConv2dImpl>(*conv, form);
    }
    report.layers += 1;
    report.bytes_before += bytes(weight);
    for (const auto& t : {form.codes, form.scale, form.absmax, form.nested_absmax, form.offset}) report.bytes_after += bytes(t);
    report.largest = std::max(report.largest, weight.numel());
    report.transient = std::max(report.transient, restore_bytes(dtype, weight.numel()));
    replace_layer(model, path, stored);
    module.reset();
  }
  return report;
}

std::vector<std::pair<std::string, torch::Tensor>> restored_tensors(const SanaMSImpl& model) {
  torch::NoGradGuard no_grad;
  std::map<std::string, std::pair<StoredWeight, torch::ScalarType>> stored;  // layer path -> its weight
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto s = stored_of(*item.value())) stored.emplace(item.key(), std::move(*s));
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto add = [&](const std::string& name, const torch::Tensor& t) {
    const auto dot = name.rfind('.');
    const auto it = dot == std::string::npos ? stored.end() : stored.find(name.substr(0, dot));
    const auto field = it == stored.end() ? std::string() : name.substr(dot + 1);
    if (field == "weight") {
      out.emplace_back(name, restore_weight(it->second.first, it->second.second));
    } else if (field.rfind("weight_", 0) != 0) {  // what turns the codes back is folded into the weight
      out.emplace_back(name, t);
    }
  };
  for (const auto& p : model.named_parameters()) add(p.key(), p.value());
  for (const auto& b : model.named_buffers()) add(b.key(), b.value());
  return out;
}

StorageDtype frozen_storage_dtype(const SanaMSImpl& model) {
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (const auto s = stored_of(*m)) return s->first.dtype;
  }
  return StorageDtype::fp32;
}

}  // namespace sana::model
