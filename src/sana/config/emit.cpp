// Writes a Config as YAML: every key, nested by section, each with its help as a comment.
// The output loads back to the same Config (tested).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "sana/config/loader.h"
#include "sana/config/schema.h"
#include "sana/util/hash.h"

namespace sana::config {

namespace {

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
    parts.push_back(key.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(key.substr(start));
  return parts;
}

}  // namespace

namespace {

std::string emit(const Config& config, std::vector<std::string> skip) {
  Config copy = config;
  std::string out = "# sana-train config, fully resolved\n";
  if (upstream_batch_style(config.train)) {
    // Derived from train_batch_size and the world size: written, they would set both styles.
    skip.insert(skip.end(), {"train.global_batch_size", "train.micro_batch_size"});
    out += fmt::format("# train.global_batch_size {} and micro_batch_size {} follow train_batch_size\n",
                       config.train.global_batch_size, config.train.micro_batch_size);
  }
  std::vector<std::string> open;  // the sections the previous key was in
  for (const Field& f : fields_of(copy)) {
    if (std::find(skip.begin(), skip.end(), f.key) != skip.end()) continue;
    std::vector<std::string> parts = split_key(f.key);
    const std::string name = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (size_t depth = common; depth < parts.size(); ++depth) {
      out += fmt::format("{:{}}{}:\n", "", 2 * depth, parts[depth]);
    }
    open = parts;
    out += fmt::format("{:{}}{}: {}  # {}\n", "", 2 * parts.size(), name, value_text(f.ref), f.help);
  }
  return out;
}

}  // namespace

std::string to_yaml(const Config& config) {
  std::string notes;
  for (const auto& note : config.load_notes) notes += "# note: " + note + "\n";
  return notes + emit(config, {});
}

std::map<std::string, std::string> config_values(const Config& config) {
  Config copy = config;
  std::map<std::string, std::string> out;
  for (const Field& f : fields_of(copy)) out[f.key] = value_text(f.ref);
  return out;
}

std::vector<std::string> config_changes(const std::map<std::string, std::string>& before,
                                        const std::map<std::string, std::string>& after) {
  std::vector<std::string> out;
  for (const auto& [key, old_value] : before) {
    const auto now = after.find(key);
    if (now != after.end() && now->second != old_value) out.push_back(fmt::format("{}: {} -> {}", key, old_value, now->second));
  }
  return out;
}

std::string config_fingerprint(const Config& config) {
  // Keys that may rightly differ between ranks (per host or per process).
  static const std::vector<std::string> per_rank = {"log_level", "log_console", "dist.master_addr",
                                                     "dist.socket_ifname",
                                                     "dist.threads_per_process",
                                                     "train.num_workers"};
  const std::string text = emit(config, per_rank);
  return hash_hex(text);
}

}  // namespace sana::config
