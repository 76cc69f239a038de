#include "sana/model/hf_weights.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "sana/model/weights.h"
#include "sana/util/safetensors.h"

namespace sana::model {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw WeightsError(fmt::format("{}: not JSON ({})", path.string(), e.what()));
  }
}

}  // namespace

nlohmann::json read_hf_config(const std::string& folder) {
  const fs::path p = fs::path(folder) / "config.json";
  return fs::exists(p) ? read_json(p) : nlohmann::json();
}

bool holds_hf_weights(const std::string& folder, const std::string& stem) {
  const fs::path dir(folder);
  return fs::exists(dir / (stem + ".safetensors")) || fs::exists(dir / (stem + ".safetensors.index.json"));
}

std::map<std::string, torch::Tensor> read_hf_weights(const std::string& folder, const std::string& stem) {
  const fs::path dir(folder), index = dir / (stem + ".safetensors.index.json");
  std::vector<fs::path> files;
  if (fs::exists(index)) {
    std::set<std::string> shards;
    const auto json = read_json(index);
    if (!json.contains("weight_map") || !json.at("weight_map").is_object()) {
      throw WeightsError(fmt::format("{}: no weight_map", index.string()));
    }
    for (const auto& [name, file] : json.at("weight_map").items()) shards.insert(file.get<std::string>());
    for (const auto& s : shards) files.push_back(dir / s);
  } else {
    files.push_back(dir / (stem + ".safetensors"));
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& f : files) {
    if (!fs::exists(f)) {
      throw WeightsError(fmt::format("{}: missing (the folder {} names it{})", f.string(), dir.string(),
                                     fs::exists(index) ? " in its index" : ""));
    }
    try {
      for (auto& [name, t] : read_safetensors(f.string()).tensors) {
        if (!out.emplace(name, t).second) throw WeightsError(fmt::format("{}: {} is in two shards", dir.string(), name));
      }
    } catch (const SafetensorsError& e) {
      throw WeightsError(e.what());
    }
  }
  return out;
}

}  // namespace sana::model
