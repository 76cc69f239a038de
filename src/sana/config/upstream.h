// NVlabs/Sana's config keys that are not ours as written: keys that moved or were renamed
// (read at upstream's path too), values with upstream's names (CAMEWrapper), and keys
// accepted with one note saying why they have no effect here. The loader applies this
// before matching keys to fields, so a Sana YAML loads unchanged. The table, key by key,
// is in docs/upstream.md. Never includes torch.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sana/config/loader.h"

namespace sana::config {

// What becomes of one YAML leaf written at `key`.
struct UpstreamTranslation {
  std::string key;        // the key it sets (== the input key when it is not upstream's)
  YAML::Node value;       // the value it sets (upstream's value names translated)
  bool dropped = false;   // accepted with no effect: nothing is set
  std::string note;       // one line for the log, or empty
  std::string error;      // non-empty: this value cannot be honoured here
  std::string hint;       // with error: what to do
};

UpstreamTranslation translate_upstream(const std::string& key, const YAML::Node& value);

// text_encoder.text_encoder_name's choices: none, torchscript and upstream's encoder names.
const std::vector<std::string>& text_encoder_names();

// The feature width of an upstream text encoder name, or 0 for none/torchscript/unknown.
int64_t text_encoder_width(const std::string& name);

// Upstream's hub repo of an encoder name that runs natively here (the Gemma-2 ones:
// Efficient-Large-Model/gemma-2-2b-it, google/gemma-2-9b, ...), "" for any other name.
std::string text_encoder_hub_name(const std::string& name);
// The encoder names that run natively (those with a hub repo), in upstream's order.
std::vector<std::string> native_text_encoder_names();

// After loading: upstream's batch style (train_batch_size, gradient_accumulation_steps) sets
// the global and micro batch for `world_size` (an error when ours is set too), and an upstream
// text encoder name sets caption_channels unless the YAML does. Notes go to load_notes.
void resolve_upstream_style(Config& config, const OriginMap& origins, int64_t world_size,
                            std::vector<ConfigIssue>& issues);

// A value that names a model to download (org/name) rather than a local file.
bool looks_like_hub_name(const std::string& path);

}  // namespace sana::config
