// A Hugging Face folder's tensors and config, as save_pretrained writes them: config.json,
// and STEM.safetensors or its shards with STEM.safetensors.index.json (diffusers' STEM is
// diffusion_pytorch_model, transformers' model). Errors are WeightsErrors naming the file.
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace sana::model {

// The folder's config.json; null when it has none.
nlohmann::json read_hf_config(const std::string& folder);
// Whether the folder holds STEM.safetensors or STEM.safetensors.index.json.
bool holds_hf_weights(const std::string& folder, const std::string& stem);
// Every tensor of STEM.safetensors, or of each shard the index names (a name in two shards
// is an error), by its name.
std::map<std::string, torch::Tensor> read_hf_weights(const std::string& folder, const std::string& stem);

}  // namespace sana::model
