#include "sana/model/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>

#include "sana/model/diffusers_format.h"
#include "sana/model/weights.h"
#include "sana/util/error.h"
#include "sana/util/hash.h"

namespace sana::model {

namespace {

const char* const kPrefix = "transformer.";
const char* const kMetadataKey = "lora_adapter_metadata";

// One base layer as LoRA sees it.
struct Site {
  std::string module;  // our path: blocks.3.attn.qkv
  torch::Tensor weight;        // as the layer keeps it (a stored base's codes: model/frozen_storage.h)
  std::vector<int64_t> shape;  // the weight's own
  bool conv = false;
  int64_t stride = 1, padding = 0, groups = 1;
  std::shared_ptr<torch::nn::Module> layer;
  torch::ScalarType compute = torch::kFloat32;  // the layer's compute dtype
};

std::vector<Site> sites_of(SanaMSImpl& model) {
  std::vector<Site> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (item.key().rfind("controlnet.", 0) == 0) continue;  // a ControlNet's own blocks are not the base's
    if (auto* linear = item.value()->as<LinearImpl>()) {
      out.push_back({item.key(), linear->weight, linear->weight_shape(), false, 1, 0, 1, item.value(),
                     linear->compute_dtype()});
    } else if (auto* conv = item.value()->as<Conv2dImpl>()) {
      out.push_back({item.key(), conv->weight, conv->weight_shape(), true, conv->stride, conv->padding, conv->groups,
                     item.value(), conv->compute_dtype()});
    }
  }
  return out;
}

}  // namespace

// What Lora puts in the model (not in an anonymous namespace: Lora::Layer holds them).
namespace lora_layers {

// The adapters of one base layer: one per targeted diffusers part of it.
struct Adapters {
  struct Part {
    int64_t index = 0;
    torch::Tensor a, b;
  };
  bool conv = false;
  int64_t stride = 1, padding = 0;
  int64_t parts = 1, rows = 0;  // parts of the layer's output and rows of each
  double scale = 1, dropout = 0;
  torch::Tensor weight;  // the base layer's
  std::vector<Part> adapted;

  torch::Tensor part_delta(const torch::Tensor& x, const Part& p) const {
    if (!conv) return torch::linear(torch::linear(x, p.a), p.b);
    return torch::conv2d(torch::conv2d(x, p.a, {}, stride, padding), p.b);
  }

  // B(A(dropout(x))) * scale, per part of the layer's output.
  torch::Tensor delta(const torch::Tensor& x_in, bool training) const {
    const auto x = training && dropout > 0 ? torch::dropout(x_in, dropout, true) : x_in;
    if (adapted.size() == 1 && parts == 1) return part_delta(x, adapted[0]) * scale;
    std::vector<torch::Tensor> pieces(static_cast<size_t>(parts));
    for (const auto& p : adapted) pieces[static_cast<size_t>(p.index)] = part_delta(x, p);
    const auto& any = pieces[static_cast<size_t>(adapted[0].index)];
    for (auto& piece : pieces) {
      if (!piece.defined()) piece = torch::zeros_like(any);  // a part no target selected adds nothing
    }
    return torch::cat(pieces, conv ? 1 : -1) * scale;
  }

  std::vector<torch::Tensor> tensors() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : adapted) {
      out.push_back(p.a);
      out.push_back(p.b);
    }
    return out;
  }
};

// PEFT's LoRA layers: the wrapped layer's output plus its adapters'. The wrapper registers
// the base's weight and bias under their own names, so the model's parameters and state
// dict stay the base's; the adapters are not registered.
template <class Layer>
class LoraLayer : public Layer {
 public:
  LoraLayer(std::shared_ptr<Layer> base, std::shared_ptr<const Adapters> adapters)
      : Layer(*base), base_(std::move(base)), adapters_(std::move(adapters)) {}
  torch::Tensor forward(const torch::Tensor& x) override {
    return base_->forward(x) + adapters_->delta(x, this->is_training());
  }
  std::vector<torch::Tensor> extra_inputs() const override {
    auto out = base_->extra_inputs();
    for (const auto& t : adapters_->tensors()) out.push_back(t);
    return out;
  }
  torch::ScalarType compute_dtype() const override { return base_->compute_dtype(); }
  std::vector<int64_t> weight_shape() const override { return base_->weight_shape(); }
  void train(bool on) override {
    Layer::train(on);
    base_->train(on);
  }

 protected:
  std::shared_ptr<Layer> base_;
  std::shared_ptr<const Adapters> adapters_;
};

using LoraLinearImpl = LoraLayer<LinearImpl>;

class LoraConv2dImpl : public LoraLayer<Conv2dImpl> {
 public:
  using LoraLayer::LoraLayer;
  // The adapters' convolutions run on the image the tokens lay out.
  torch::Tensor forward_tokens(const torch::Tensor& x, int64_t h, int64_t w) override {
    const int64_t B = x.size(0);
    const auto image = x.reshape({B, h, w, x.size(-1)}).permute({0, 3, 1, 2});
    return base_->forward_tokens(x, h, w) +
           adapters_->delta(image, is_training()).permute({0, 2, 3, 1}).reshape({B, h * w, -1});
  }
};

}  // namespace lora_layers

using lora_layers::Adapters;
using lora_layers::LoraConv2dImpl;
using lora_layers::LoraLinearImpl;

namespace {

torch::Tensor initial_a(const std::string& name, const torch::Tensor& like_shape_of, const LoraOptions& o,
                        const torch::TensorOptions& to) {
  if (to.device().is_meta()) return torch::empty(like_shape_of.sizes(), to);
  const uint64_t seed = Hasher(o.seed).update(name).digest();
  auto gen = at::detail::createCPUGenerator(seed);
  auto a = torch::empty(like_shape_of.sizes(), torch::kFloat32);
  if (o.gaussian) {
    a.normal_(0.0, 1.0 / static_cast<double>(o.rank), gen);  // PEFT's init_lora_weights="gaussian"
  } else {
    const double bound = 1.0 / std::sqrt(static_cast<double>(a[0].numel()));  // kaiming_uniform, a = sqrt(5)
    a.uniform_(-bound, bound, gen);
  }
  return a.to(to);
}

}  // namespace

bool lora_targets(const std::string& name, const std::vector<std::string>& targets) {
  for (const auto& t : targets) {
    if (name == t) return true;
    if (name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0 &&
        name[name.size() - t.size() - 1] == '.') {
      return true;
    }
  }
  return false;
}

std::vector<std::string> adaptable_modules(SanaMSImpl& model) {
  std::vector<std::string> out;
  for (const auto& site : sites_of(model)) {
    if (site.groups != 1) continue;
    for (const auto& m : diffusers_modules(site.module, model.spec().cfg_embed)) out.push_back(m.name);
  }
  return out;
}

// A layer LoRA wrapped: where it is, the layer it replaced, and its adapters.
struct Lora::Layer {
  std::string path;
  std::shared_ptr<torch::nn::Module> base;
  std::shared_ptr<lora_layers::Adapters> adapters;
};

Lora::Lora(SanaMSImpl& model, const LoraOptions& options, std::string base_checksum)
    : model_(model), options_(options), base_checksum_(std::move(base_checksum)) {
  std::set<std::string> used;
  std::vector<std::pair<Site, std::shared_ptr<Adapters>>> planned;
  for (auto& site : sites_of(model)) {
    const auto modules = diffusers_modules(site.module, model.spec().cfg_embed);
    std::shared_ptr<Adapters> adapters;
    for (const auto& m : modules) {
      if (!lora_targets(m.name, options.targets)) continue;
      for (const auto& t : options.targets) {
        if (lora_targets(m.name, {t})) used.insert(t);
      }
      if (site.groups != 1) {
        throw SpecError("train.lora.target_modules",
                        fmt::format("selects {}, a grouped (depthwise) convolution: LoRA adapts Linear layers and "
                                    "ungrouped convolutions only; leave it out",
                                    m.name));
      }
      if (!adapters) {
        adapters = std::make_shared<Adapters>();
        adapters->conv = site.conv;
        adapters->stride = site.stride;
        adapters->padding = site.padding;
        adapters->parts = m.parts;
        adapters->rows = site.shape[0] / m.parts;
        adapters->scale = options.scale();
        adapters->dropout = options.dropout;
        adapters->weight = site.weight;
      }
      const int64_t in = site.shape[1];
      // In the layer's compute dtype: a base stored in bf16 or int8 trains fp32 adapters.
      const auto to = site.weight.options().dtype(site.compute).requires_grad(false);
      const auto a_shape = site.conv ? std::vector<int64_t>{options.rank, in, site.shape[2], site.shape[3]}
                                     : std::vector<int64_t>{options.rank, in};
      const auto b_shape = site.conv ? std::vector<int64_t>{adapters->rows, options.rank, 1, 1}
                                     : std::vector<int64_t>{adapters->rows, options.rank};
      const std::string name = kPrefix + m.name;
      Adapters::Part part;
      part.index = m.part;
      part.a = initial_a(name + ".lora_A.weight", torch::empty(a_shape, torch::kMeta), options, to)
                   .set_requires_grad(true);
      part.b = torch::zeros(b_shape, to).set_requires_grad(true);
      adapters->adapted.push_back(part);
      params_.emplace_back(name + ".lora_A.weight", part.a);
      params_.emplace_back(name + ".lora_B.weight", part.b);
    }
    if (adapters) planned.emplace_back(site, adapters);
  }
  for (const auto& t : options.targets) {
    if (used.count(t) != 0) continue;
    std::vector<std::string> names;
    for (const auto& n : adaptable_modules(model)) {
      if (n.rfind("transformer_blocks.", 0) != 0 || n.rfind("transformer_blocks.0.", 0) == 0) names.push_back(n);
    }
    throw SpecError("train.lora.target_modules",
                    fmt::format("'{}' selects no layer LoRA can adapt in {} (names are diffusers', matched whole or as "
                                "a suffix after a dot); the layers are {} and the same in every block",
                                t, model.spec().name, fmt::join(names, ", ")));
  }
  // Wrapped once every target is known good: a refusal leaves the model as it was.
  for (const auto& [site, adapters] : planned) {
    std::shared_ptr<torch::nn::Module> wrapper;
    if (site.conv) {
      wrapper = std::make_shared<LoraConv2dImpl>(std::dynamic_pointer_cast<Conv2dImpl>(site.layer), adapters);
    } else {
      wrapper = std::make_shared<LoraLinearImpl>(std::dynamic_pointer_cast<LinearImpl>(site.layer), adapters);
    }
    layers_.push_back(std::make_shared<Layer>(Layer{site.module, replace_layer(model, site.module, wrapper), adapters}));
  }
}

Lora::~Lora() {
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    try {
      replace_layer(model_, (*it)->path, (*it)->base);
    } catch (const std::exception&) {  // the model's own layers: cannot fail once wrapped
    }
  }
}

int64_t Lora::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, t] : params_) n += t.numel();
  return n;
}

std::map<std::string, std::string> Lora::file_metadata() const {
  const double alpha = options_.alpha > 0 ? options_.alpha : static_cast<double>(options_.rank);
  nlohmann::json config = {
      {"r", options_.rank},
      {"lora_alpha", alpha},
      {"lora_dropout", options_.dropout},
      {"target_modules", options_.targets},
      {"init_lora_weights", options_.gaussian ? nlohmann::json("gaussian") : nlohmann::json(true)},
      {"bias", "none"},
      {"use_dora", false},
      {"use_rslora", false},
  };
  nlohmann::json packed;  // diffusers' _pack_dict_with_prefix(..., "transformer")
  for (const auto& [key, value] : config.items()) packed[kPrefix + key] = value;
  return {{"format", "pt"}, {kMetadataKey, packed.dump(2)}};
}

void Lora::merge_into_base() const {
  torch::NoGradGuard no_grad;
  for (const auto& wrapped : layers_) {
    const auto& layer = wrapped->adapters;
    for (const auto& p : layer->adapted) {
      auto rows = layer->weight.narrow(0, p.index * layer->rows, layer->rows);
      const auto product = torch::matmul(p.b.flatten(1).to(torch::kFloat64), p.a.flatten(1).to(torch::kFloat64));
      rows.add_((product * layer->scale).view(rows.sizes()).to(rows.scalar_type()));
    }
  }
}

PartState Lora::save_state() const { return save_state_of([](const std::string&) { return true; }); }

PartState Lora::save_state_of(const std::function<bool(const std::string&)>& keep) const {
  NamedTensors tensors;
  for (const auto& [name, t] : params_) {
    if (keep(name)) tensors.emplace_back(name, t.detach().to(torch::kCPU).clone());
  }
  PartState s;
  s.json = {{"base_checksum", base_checksum_},
            {"rank", options_.rank},
            {"alpha", options_.alpha},
            {"target_modules", options_.targets}};
  s.tensors = std::move(tensors);
  s.metadata = file_metadata();
  s.metadata["base_checksum"] = base_checksum_;
  return s;
}

void Lora::restore_state(const PartState* saved, const std::string& source) {
  if (saved == nullptr || !saved->tensors) {
    throw WeightsError(fmt::format(
        "{} holds no LoRA adapters (no lora.safetensors): a run without train.lora wrote it. To train LoRA on its "
        "weights, set model.load_from to its model.safetensors and start in a new work_dir (or resume_from: none)",
        source));
  }
  check_saved_base(*saved, base_checksum_, "adapters", source);
  load({saved->tensors->begin(), saved->tensors->end()}, source);
}

void Lora::load(const std::map<std::string, torch::Tensor>& by_name, const std::string& source) {
  copy_exactly(params_, by_name, source, "adapters",
               "use the rank and target_modules (train.lora) they were trained with");
}

LoraFile read_lora_file(const std::string& path, const std::string& ema_tensors) {
  const auto file = read_safetensors(path);
  LoraFile out;
  std::set<std::string> modules;
  for (const auto& [name, t] : file.tensors) {
    const auto at = name.find(".lora_A.weight");
    if (name.rfind(kPrefix, 0) != 0 || (at == std::string::npos && name.find(".lora_B.weight") == std::string::npos)) {
      throw WeightsError(fmt::format("{}: '{}' is not a LoRA tensor in diffusers' naming "
                                     "(transformer.<module>.lora_A.weight / lora_B.weight)",
                                     path, name));
    }
    out.tensors[name] = t;
    if (at == std::string::npos) continue;
    modules.insert(name.substr(std::string(kPrefix).size(), at - std::string(kPrefix).size()));
    out.rank = t.size(0);
  }
  out.targets.assign(modules.begin(), modules.end());
  out.alpha = static_cast<double>(out.rank);  // diffusers without metadata
  const auto meta = file.metadata.find(kMetadataKey);
  if (meta != file.metadata.end()) {
    const auto j = nlohmann::json::parse(meta->second, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("transformer.lora_alpha")) out.alpha = j.at("transformer.lora_alpha").get<double>();
  }
  const auto base = file.metadata.find("base_checksum");
  if (base != file.metadata.end()) out.base_checksum = base->second;
  if (!ema_tensors.empty()) {
    for (const auto& [name, t] : read_safetensors(ema_tensors).tensors) {
      if (out.tensors.count(name) == 0) {
        throw WeightsError(fmt::format("{}: '{}' is not an adapter of {}", ema_tensors, name, path));
      }
      out.tensors[name] = t;
    }
  }
  return out;
}

void merge_lora_file(SanaMSImpl& model, const LoraFile& file, const std::string& base_checksum,
                     const std::string& source) {
  if (!file.base_checksum.empty() && file.base_checksum != base_checksum) {
    throw WeightsError(fmt::format("{}: its adapters were trained on base weights with checksum {}; these base weights "
                                   "(model.load_from) have checksum {}. Give the base they were trained on",
                                   source, file.base_checksum, base_checksum));
  }
  LoraOptions o;
  o.rank = file.rank;
  o.alpha = file.alpha;
  o.targets = file.targets;
  Lora lora(model, o, base_checksum);
  lora.load(file.tensors, source);
  lora.merge_into_base();
}

}  // namespace sana::model
