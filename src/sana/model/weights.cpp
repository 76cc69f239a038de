#include "sana/model/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>

#include <fstream>
#include <iterator>

#include "sana/model/diffusers_format.h"
#include "sana/model/sana_ms.h"
#include "sana/model/storage_dtype.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace sana::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_text(at::IntArrayRef s) { return s.empty() ? "scalar" : fmt::format("{}", fmt::join(s, "x")); }

std::map<std::string, torch::Tensor> from_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw WeightsError(fmt::format("cannot open '{}'", path));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    // LibTorch 1.13's unpickler lacks SETITEM, which pickle uses for a dict of one entry.
    const std::string hint = what.find("opcode for unpickling at 0x73") != std::string::npos
                                 ? "a dict with a single entry (pickle's SETITEM) is beyond this LibTorch's unpickler: "
                                   "save the tensors themselves as the dict, or as safetensors"
                                 : "save it with torch.save(model.state_dict()) or as safetensors";
    throw WeightsError(fmt::format("'{}' is not a state dict LibTorch can read ({}); {}", path,
                                   what.substr(0, std::min(what.find('\n'), size_t{200})), hint));
  }
  if (value.isGenericDict()) {  // upstream's checkpoints: {"state_dict": ..., "state_dict_ema": ...}
    const auto dict = value.toGenericDict();
    for (const auto& key : {"state_dict", "model"}) {
      if (dict.contains(key) && dict.at(key).isGenericDict()) {
        value = dict.at(key);
        break;
      }
    }
  }
  if (!value.isGenericDict()) throw WeightsError(fmt::format("'{}' holds no dict of tensors", path));
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    if (item.key().isString() && item.value().isTensor()) {
      out[item.key().toStringRef()] = item.value().toTensor();
    }
  }
  return out;
}

// Buffers upstream's SanaMS saves that this model does not have (see LoadReport::ignored).
bool is_ignored_upstream_buffer(const std::string& name) { return name == "pos_embed"; }

}  // namespace

NamedTensors module_tensors(const torch::nn::Module& model) {
  NamedTensors tensors;
  for (const auto& p : model.named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers()) tensors.emplace_back(b.key(), b.value());
  return tensors;
}

void save_weights(const torch::nn::Module& model, const std::string& path,
                  const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, module_tensors(model), metadata);
}

std::map<std::string, torch::Tensor> read_state_dict(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  if (ends_with(path, ".safetensors")) {
    try {
      for (auto& [name, t] : read_safetensors(path).tensors) out[name] = t;
    } catch (const SafetensorsError& e) {
      throw WeightsError(e.what());
    }
  } else {
    out = from_pickle(path);
  }
  // Weights saved from a DistributedDataParallel wrapper carry "module." in front.
  std::map<std::string, torch::Tensor> stripped;
  for (auto& [name, t] : out) {
    stripped[name.rfind("module.", 0) == 0 ? name.substr(7) : name] = t;
  }
  return stripped;
}

std::string LoadReport::summary() const {
  auto list = [](const std::vector<std::string>& v) {
    std::vector<std::string> head(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(v.size(), 5)));
    return fmt::format("{}{}", fmt::join(head, ", "), v.size() > 5 ? fmt::format(" and {} more", v.size() - 5) : "");
  };
  std::string s = fmt::format("{} tensors loaded", loaded);
  if (!missing.empty()) s += fmt::format("; {} missing from the file: {}", missing.size(), list(missing));
  if (!unexpected.empty()) s += fmt::format("; {} not in the model: {}", unexpected.size(), list(unexpected));
  if (!mismatched.empty()) s += fmt::format("; {} with another shape: {}", mismatched.size(), list(mismatched));
  return s;
}

namespace {

// A diffusers folder's config.json against the model's preset: a mismatch is refused, but
// for what a fine-tune may change, which model.load_strict: false accepts with a line.
void check_config(const nlohmann::json& config, const ModelSpec& spec, const std::string& path, bool strict) {
  std::vector<std::string> wrong, changed;
  bool could_change = false;  // a refusal a non-strict load would have accepted
  for (const auto& m : config_mismatches(config, spec)) {
    (!strict && m.fine_tune_may_change() ? changed : wrong).push_back(m.text);
    could_change = could_change || (strict && m.fine_tune_may_change());
  }
  if (!wrong.empty()) {
    throw WeightsError(fmt::format("'{}': its config.json does not describe model.model {}: {} (pick the preset it "
                                   "was trained as, or the right folder{})",
                                   path, spec.name, fmt::join(wrong, "; "),
                                   could_change ? "; model.load_strict: false lets a fine-tune add q/k norms, a "
                                                  "guidance embedding or normT's timestep scale"
                                                : ""));
  }
  if (!changed.empty()) {
    log::info("'{}': model.load_strict is false: the run trains model.model {} as its preset where the file's "
              "config.json differs ({}); the layers the file lacks start from their initial weights",
              path, spec.name, fmt::join(changed, "; "));
  }
}

// diffusers' names to ours, after checking its config.json against the model's preset; the
// null caption, which diffusers' transformer has none of, stays the model's own (the run's
// text encoder makes it).
LoadReport load_diffusers(torch::nn::Module& model, const TensorMap& tensors, const nlohmann::json& config,
                          const std::string& path, bool strict) {
  const auto* sana = dynamic_cast<const SanaMSImpl*>(&model);
  if (sana != nullptr && config.is_object()) check_config(config, sana->spec(), path, strict);
  auto upstream = from_diffusers(tensors);
  std::vector<std::string> made_by_run;
  for (const auto& b : model.named_buffers()) {
    if (b.key() != "y_embedder.y_embedding" || upstream.count(b.key()) != 0) continue;
    upstream[b.key()] = b.value();
    made_by_run.push_back(b.key());
    log::info("'{}': diffusers' transformer has no null caption (y_embedder.y_embedding); the run's text "
              "encoder or null-embedding file makes it",
              path);
  }
  for (const auto& p : model.named_parameters()) {  // a Sprint student's log-variance head
    if (p.key().rfind("logvar_linear.", 0) != 0 || upstream.count(p.key()) != 0) continue;
    upstream[p.key()] = p.value().detach();
    made_by_run.push_back(p.key());
    if (p.key() == "logvar_linear.weight") {
      log::info("'{}': diffusers' transformer has no logvar_linear (its converter drops SANA-Sprint's log-variance "
                "head); the student's starts from its initial weights",
                path);
    }
  }
  auto report = load_tensors(model, upstream, path, strict);
  report.made_by_run = std::move(made_by_run);
  return report;
}

}  // namespace

LoadReport load_weights(torch::nn::Module& model, const std::string& path, bool strict) {
  if (is_diffusers_folder(path)) {
    const auto files = read_diffusers(path);
    return load_diffusers(model, files.tensors, files.config, path, strict);
  }
  auto tensors = read_state_dict(path);
  if (is_diffusers_layout(tensors)) return load_diffusers(model, tensors, read_diffusers_config(path), path, strict);
  return load_tensors(model, tensors, path, strict);
}

LoadReport load_tensors(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& file,
                        const std::string& path, bool strict) {
  std::map<std::string, torch::Tensor> targets;
  for (const auto& p : model.named_parameters()) targets[p.key()] = p.value();
  for (const auto& b : model.named_buffers()) targets[b.key()] = b.value();
  LoadReport report;
  for (const auto& [name, t] : targets) {
    const auto it = file.find(name);
    if (it == file.end()) {
      report.missing.push_back(name);
    } else if (it->second.sizes() != t.sizes()) {
      report.mismatched.push_back(fmt::format("{} (file {}, model {})", name, shape_text(it->second.sizes()),
                                              shape_text(t.sizes())));
    }
  }
  for (const auto& [name, t] : file) {
    if (targets.count(name)) continue;
    (is_ignored_upstream_buffer(name) ? report.ignored : report.unexpected).push_back(name);
  }
  for (const auto& name : report.ignored) {
    log::info("'{}': {} ignored: upstream's fixed sin-cos position table is not a trained weight (with "
              "model.use_pe this model computes it for each bucket's size)",
              path, name);
  }
  if (strict && !report.clean()) {
    throw WeightsError(fmt::format("'{}' does not fit the model: {} (load non-strictly to take what fits)",
                                   path, report.summary()));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : targets) {
    const auto it = file.find(name);
    if (it == file.end() || it->second.sizes() != t.sizes()) continue;
    t.copy_(it->second);
    ++report.loaded;
  }
  return report;
}

void check_saved_base(const PartState& saved, const std::string& base_checksum, const std::string& what,
                      const std::string& source) {
  const auto saved_base = saved.json.is_object() ? saved.json.value("base_checksum", "") : "";
  if (saved_base == base_checksum) return;
  // A base stored in less than fp32 (model/frozen_storage.h) prefixes its dtype: int8:0123...
  const auto dtype_of = [](const std::string& sum) {
    const auto colon = sum.find(':');
    return colon == std::string::npos ? std::string("fp32") : sum.substr(0, colon);
  };
  if (!saved_base.empty() && dtype_of(saved_base) != dtype_of(base_checksum)) {
    throw WeightsError(fmt::format(
        "{} trained its {} on a base stored in {} (checksum {}); this run stores it in {} (checksum {}). Set {} "
        "to resume it",
        source, what, dtype_of(saved_base), saved_base, dtype_of(base_checksum), base_checksum,
        storage_dtype_setting(dtype_of(saved_base))));
  }
  throw WeightsError(fmt::format(
      "{} trained its {} on base weights with checksum {}; this run's base (model.load_from) has checksum {}. "
      "Resume with the base it was trained on, or start a new run",
      source, what, saved_base.empty() ? "(none recorded)" : saved_base, base_checksum));
}

void copy_exactly(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                  const std::map<std::string, torch::Tensor>& by_name, const std::string& source,
                  const std::string& what, const std::string& hint) {
  std::vector<std::string> missing, mismatched;
  for (const auto& [name, t] : params) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != t.sizes()) {
      mismatched.push_back(fmt::format("{}: file {}, run {}", name, fmt::join(it->second.sizes(), "x"),
                                       fmt::join(t.sizes(), "x")));
    }
  }
  const int64_t unexpected = static_cast<int64_t>(by_name.size()) - static_cast<int64_t>(params.size() - missing.size());
  if (!missing.empty() || !mismatched.empty() || unexpected != 0) {
    throw WeightsError(fmt::format("{}: its {} do not fit these ({} missing{}{}, {} others in the file): {}", source,
                                   what, missing.size(), missing.empty() ? "" : ", e.g. " + missing.front(),
                                   mismatched.empty() ? "" : "; " + mismatched.front(), unexpected, hint));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : params) t.copy_(by_name.at(name));
}

PartState ModuleState::save_state() const { return save_state_of([](const std::string&) { return true; }); }

PartState ModuleState::save_state_of(const std::function<bool(const std::string&)>& keep) const {
  NamedTensors tensors;
  for (const auto& [name, t] : module_tensors(module_)) {
    if (keep(name)) tensors.emplace_back(name, t.detach().to(torch::kCPU).clone());
  }
  return {nullptr, std::move(tensors), {}};
}

void ModuleState::restore_state(const PartState* saved, const std::string& source) {
  const auto& saved_tensors = PartState::tensors_of(saved);
  load_tensors(module_, {saved_tensors.begin(), saved_tensors.end()}, source, /*strict=*/true);
}

}  // namespace sana::model
