#include "sana/util/hf_hub.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace sana::hub {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// The hub cache folder huggingface_hub uses in this environment.
fs::path cache_root() {
  if (const auto c = env("HF_HUB_CACHE"); !c.empty()) return c;
  if (const auto h = env("HF_HOME"); !h.empty()) return fs::path(h) / "hub";
  if (const auto x = env("XDG_CACHE_HOME"); !x.empty()) return fs::path(x) / "huggingface" / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

// models--ORG--NAME/snapshots/REV: REV from refs/main, else the most recently written snapshot.
std::string snapshot_of(const fs::path& repo) {
  const fs::path snapshots = repo / "snapshots";
  if (!is_dir(snapshots)) return "";
  std::ifstream ref(repo / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev) && !rev.empty() && is_dir(snapshots / rev)) return (snapshots / rev).string();
  std::error_code ec;
  fs::path newest;
  fs::file_time_type newest_time{};
  for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
    if (!entry.is_directory(ec)) continue;
    const auto t = entry.last_write_time(ec);
    if (newest.empty() || t > newest_time) newest = entry.path(), newest_time = t;
  }
  return newest.string();
}

}  // namespace

bool is_hub_name(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= name.size()) return false;
  if (name.find('/', slash + 1) != std::string::npos) return false;
  return name[0] != '.' && name[slash + 1] != '.';
}

Lookup find_model(const std::string& name) {
  Lookup out;
  if (is_dir(name)) {
    out.folder = name;
    return out;
  }
  out.looked_in.push_back(fmt::format("{} (a local folder)", name));
  if (!is_hub_name(name)) return out;
  const std::string org = name.substr(0, name.find('/')), repo = name.substr(name.find('/') + 1);
  if (const auto models = env("SANA_MODELS_DIR"); !models.empty()) {
    for (const fs::path& candidate : {fs::path(models) / org / repo, fs::path(models) / repo}) {
      if (is_dir(candidate)) {
        out.folder = candidate.string();
        return out;
      }
      out.looked_in.push_back(candidate.string());
    }
  } else {
    out.looked_in.push_back("$SANA_MODELS_DIR (not set)");
  }
  const fs::path cached = cache_root() / fmt::format("models--{}--{}", org, repo);
  out.folder = snapshot_of(cached);
  if (out.folder.empty()) out.looked_in.push_back((cached / "snapshots").string() + " (the Hugging Face cache)");
  return out;
}

std::string download_command(const std::string& hub_name) {
  return fmt::format("huggingface-cli download {}", hub_name);
}

std::string not_found_text(const std::string& name, const Lookup& lookup) {
  if (!is_hub_name(name)) {
    return fmt::format("'{}' is not a folder on this machine, nor a hub name ORG/NAME; give the model's local folder",
                       name);
  }
  return fmt::format("'{}' is not on this machine: looked in {}; download it with `{}` (into the Hugging Face "
                     "cache), or give its local folder",
                     name, fmt::join(lookup.looked_in, ", "), download_command(name));
}

}  // namespace sana::hub
