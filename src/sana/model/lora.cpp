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
  torch::Tensor weight;
  bool conv = false;
  int64_t stride = 1, padding = 0, groups = 1;
  std::shared_ptr<const LayerAdapter>* slot = nullptr;  // where the layer keeps its adapter
};

std::vector<Site> sites_of(SanaMSImpl& model) {
  std::vector<Site> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (item.key().rfind("controlnet.", 0) == 0) continue;  // a ControlNet's own blocks are not the base's
    if (auto* linear = item.value()->as<LinearImpl>()) {
      out.push_back({item.key(), linear->weight, false, 1, 0, 1, &linear->adapter});
    } else if (auto* conv = item.value()->as<Conv2dImpl>()) {
      out.push_back({item.key(), conv->weight, true, conv->stride, conv->padding, conv->groups, &conv->adapter});
    }
  }
  return out;
}

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
    for (const auto& m : diffusers_modules(site.module)) out.push_back(m.name);
  }
  return out;
}

// The adapters of one base layer: one per targeted diffusers part of it.
struct Lora::Layer : public LayerAdapter {
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

  torch::Tensor delta(const torch::Tensor& x_in, bool training) const override {
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

  std::vector<torch::Tensor> tensors() const override {
    std::vector<torch::Tensor> out;
    for (const auto& p : adapted) {
      out.push_back(p.a);
      out.push_back(p.b);
    }
    return out;
  }
};

Lora::Lora(SanaMSImpl& model, const LoraOptions& options, std::string base_checksum)
    : model_(model), options_(options), base_checksum_(std::move(base_checksum)) {
  std::set<std::string> used;
  for (auto& site : sites_of(model)) {
    const auto modules = diffusers_modules(site.module);
    std::shared_ptr<Layer> layer;
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
      if (!layer) {
        layer = std::make_shared<Layer>();
        layer->conv = site.conv;
        layer->stride = site.stride;
        layer->padding = site.padding;
        layer->parts = m.parts;
        layer->rows = site.weight.size(0) / m.parts;
        layer->scale = options.scale();
        layer->dropout = options.dropout;
        layer->weight = site.weight;
      }
      const int64_t in = site.weight.size(1);
      const auto to = site.weight.options().requires_grad(false);
      const auto a_shape = site.conv ? std::vector<int64_t>{options.rank, in, site.weight.size(2), site.weight.size(3)}
                                     : std::vector<int64_t>{options.rank, in};
      const auto b_shape = site.conv ? std::vector<int64_t>{layer->rows, options.rank, 1, 1}
                                     : std::vector<int64_t>{layer->rows, options.rank};
      const std::string name = kPrefix + m.name;
      Layer::Part part;
      part.index = m.part;
      part.a = initial_a(name + ".lora_A.weight", torch::empty(a_shape, torch::kMeta), options, to)
                   .set_requires_grad(true);
      part.b = torch::zeros(b_shape, to).set_requires_grad(true);
      layer->adapted.push_back(part);
      params_.emplace_back(name + ".lora_A.weight", part.a);
      params_.emplace_back(name + ".lora_B.weight", part.b);
    }
    if (!layer) continue;
    *site.slot = layer;
    layers_.push_back(layer);
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
}

Lora::~Lora() {
  for (auto& site : sites_of(model_)) {
    for (const auto& layer : layers_) {
      if (site.slot->get() == layer.get()) site.slot->reset();
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
  for (const auto& layer : layers_) {
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
