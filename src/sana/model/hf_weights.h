// A Hugging Face folder's tensors and config, as save_pretrained writes them: config.json,
// and STEM.safetensors or its shards with STEM.safetensors.index.json (diffusers' STEM is
// diffusion_pytorch_model, transformers' model). Errors are WeightsErrors naming the file.
#pragma once

#include <torch/torch.h>

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "sana/model/weights.h"

namespace sana::model {

// The folder's config.json; null when it has none.
nlohmann::json read_hf_config(const std::string& folder);
// Whether the folder holds STEM.safetensors or STEM.safetensors.index.json.
bool holds_hf_weights(const std::string& folder, const std::string& stem);
// Every tensor of STEM.safetensors, or of each shard the index names (a name in two shards
// is an error), by its name.
std::map<std::string, torch::Tensor> read_hf_weights(const std::string& folder, const std::string& stem);

// Up to eight problems of a strict load, one a line ("\n  ..."), and how many more.
inline std::string problem_list(const std::vector<std::string>& problems) {
  std::string list;
  for (size_t i = 0; i < problems.size() && i < 8; ++i) list += "\n  " + problems[i];
  if (problems.size() > 8) list += fmt::format("\n  ... and {} more", problems.size() - 8);
  return list;
}

// A config.json field: its value; `fallback` (the library's default) when absent, `none` when
// null. A value of another type is a WeightsError naming the field and `where`.
template <typename T>
T config_field(const nlohmann::json& c, const char* key, T fallback, T none, const std::string& where) {
  if (!c.contains(key)) return fallback;
  const auto& v = c.at(key);
  if (v.is_null()) return none;
  try {
    return v.get<T>();
  } catch (const std::exception&) {
    const char* kind = std::is_same_v<T, bool> ? "boolean" : std::is_arithmetic_v<T> ? "number" : "list or string";
    throw WeightsError(fmt::format("{}: {} is {}, not a {}", where, key, v.dump(), kind));
  }
}

}  // namespace sana::model
