#include "sana/config/loader.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "sana/config/schema.h"
#include "sana/config/upstream.h"
#include "sana/util/text.h"

namespace fs = std::filesystem;

namespace sana::config {

// ---------------------------------------------------------------------------------------
// Layers: every leaf value seen so far, keyed by dotted path, later layers winning.

// One key as the layers set it. Not in the anonymous namespace: ConfigLoader::Layers
// holds them (gcc's -Wsubobject-linkage, in the unity build).
struct LayeredEntry {
  std::string key;
  YAML::Node value;
  Origin key_origin;
  Origin value_origin;
  int64_t written = 0;  // when it was last set: later layers and later lines win
};

namespace {

Origin mark_origin(const std::string& file, const YAML::Mark& mark) {
  Origin o;
  o.file = file;
  if (mark.line >= 0) {
    o.line = mark.line + 1;
    o.column = mark.column + 1;
  }
  return o;
}

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "an empty value";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    default: return fmt::format("\"{}\"", node.Scalar());
  }
}

}  // namespace

struct ConfigLoader::Layers {
  std::vector<LayeredEntry> entries;  // in first-seen order
  std::map<std::string, Origin> section_origins;  // where each mapping key was first seen
  std::vector<ConfigIssue> issues;
  bool file_failed = false;  // a file or base could not be read: its keys are unknown
  std::vector<std::string> loading;  // files being loaded, for cycle detection

  int64_t writes = 0;

  void set(LayeredEntry e) {
    e.written = ++writes;
    auto it = std::find_if(entries.begin(), entries.end(),
                           [&](const LayeredEntry& x) { return x.key == e.key; });
    if (it == entries.end()) {
      entries.push_back(std::move(e));
    } else {
      *it = std::move(e);
    }
  }

  // Leaves of `node` under `prefix`. Mappings nest; everything else is a leaf.
  void flatten(const YAML::Node& node, const std::string& prefix, const Origin& key_origin,
               const Origin& value_origin, const std::string& file) {
    // An empty mapping under a key is a value (upstream's `auto_lr: {}` means "off").
    if (!node.IsMap() || (node.size() == 0 && !prefix.empty())) {
      set(LayeredEntry{prefix, node, key_origin, node.IsNull() ? key_origin : value_origin});
      return;
    }
    if (!prefix.empty()) section_origins.emplace(prefix, key_origin);
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string name = it->first.Scalar();
      const std::string key = prefix.empty() ? name : prefix + "." + name;
      Origin ko = file.empty() ? key_origin : mark_origin(file, it->first.Mark());
      Origin vo = file.empty() ? value_origin : mark_origin(file, it->second.Mark());
      if (!seen.insert(name).second) {
        issues.push_back({key, "appears twice in the same mapping", ko,
                          "keep one of them; the YAML would silently drop the other"});
        continue;
      }
      if (prefix.empty() && name == "base") continue;  // handled by add_file
      flatten(it->second, key, ko, vo, file);
    }
  }

  void load_file(const std::string& path, const Origin& requested_at) {
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(fs::path(path), ec);
    const std::string id = ec ? path : canonical.string();
    if (std::find(loading.begin(), loading.end(), id) != loading.end()) {
      issues.push_back({"base", fmt::format("'{}' includes itself through base:", path),
                        requested_at, "remove the cycle from the base: chain"});
      file_failed = true;
      return;
    }
    if (!fs::is_regular_file(path, ec)) {
      issues.push_back({requested_at.file.empty() ? "--config" : "base",
                        fmt::format("config file '{}' not found", path), requested_at,
                        "check the path (base: paths are relative to the file naming them)"});
      file_failed = true;
      return;
    }
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      issues.push_back({"", fmt::format("YAML syntax error: {}", e.msg),
                        mark_origin(path, e.mark), "fix the YAML at that line"});
      file_failed = true;
      return;
    }
    if (root.IsNull()) return;  // an empty file is an empty layer
    if (!root.IsMap()) {
      issues.push_back({"", "the top level of a config must be a mapping of sections",
                        mark_origin(path, root.Mark()), "start with e.g. 'train:'"});
      file_failed = true;
      return;
    }
    loading.push_back(id);
    load_bases(root, path);
    flatten(root, "", {}, {}, path);
    loading.pop_back();
  }

  void load_bases(const YAML::Node& root, const std::string& path) {
    const YAML::Node base = root["base"];
    if (!base) return;
    const Origin at = mark_origin(path, base.Mark());
    std::vector<std::string> names;
    if (base.IsScalar()) {
      names.push_back(base.Scalar());
    } else if (base.IsSequence()) {
      for (const auto& item : base) {
        if (!item.IsScalar()) {
          issues.push_back({"base", "expected a file name or a list of file names", at, ""});
          file_failed = true;
          return;
        }
        names.push_back(item.Scalar());
      }
    } else if (!base.IsNull()) {
      issues.push_back({"base", "expected a file name or a list of file names", at, ""});
      file_failed = true;
      return;
    }
    const fs::path dir = fs::path(path).parent_path();
    for (const auto& name : names) {
      fs::path p(name);
      load_file((p.is_absolute() ? p : dir / p).string(), at);
    }
  }
};

// ---------------------------------------------------------------------------------------
// Typed conversion of a YAML node into a field.

namespace {

// Parsers leave `out` untouched on failure, so one bad value yields one error.
bool parse_int(const YAML::Node& n, int64_t& out) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size() || begin == ptr) return false;
  out = value;
  return true;
}

bool parse_double(const YAML::Node& n, double& out) {
  if (!n.IsScalar() || n.Scalar().empty()) return false;
  const std::string& s = n.Scalar();
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf") return out = std::numeric_limits<double>::infinity(), true;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0 || !std::isfinite(value)) return false;
  out = value;
  return true;
}

bool parse_bool(const YAML::Node& n, bool& out) {
  if (!n.IsScalar()) return false;
  const std::string s = ascii_lower(n.Scalar());
  if (s == "true" || s == "yes" || s == "on") return out = true, true;
  if (s == "false" || s == "no" || s == "off") return out = false, true;
  return false;
}

template <class T, class Parse>
bool parse_list(const YAML::Node& n, std::vector<T>& out, Parse&& parse) {
  std::vector<T> values;
  if (n.IsNull()) {
    out.clear();
    return true;
  }
  if (n.IsScalar()) {  // a single value is a list of one
    T v{};
    if (!parse(n, v)) return false;
    out = {v};
    return true;
  }
  if (!n.IsSequence()) return false;
  for (const auto& item : n) {
    T v{};
    if (!parse(item, v)) return false;
    values.push_back(v);
  }
  out = std::move(values);
  return true;
}

bool parse_string(const YAML::Node& n, std::string& out) {
  if (n.IsNull()) return out.clear(), true;
  if (!n.IsScalar()) return false;
  out = n.Scalar();
  return true;
}

// Sets a field from a YAML value; false when the value has the wrong type. An enum's
// unknown name leaves the field alone and lands in `unknown_name`.
struct Assign {
  const YAML::Node& node;
  std::optional<std::string>& unknown_name;
  bool operator()(const ChoiceRef& c) const {
    if (node.IsNull()) return unknown_name = "", true;  // no name: the choices say what to write
    if (!node.IsScalar()) return false;
    if (!c.set_name(node.Scalar())) unknown_name = node.Scalar();
    return true;
  }
  bool operator()(int64_t* v) const { return parse_int(node, *v); }
  bool operator()(const IntOrWord& w) const {
    if (node.IsScalar() && ascii_lower(node.Scalar()) == w.word) return *w.word_given = true, true;
    if (!parse_int(node, *w.value)) return false;
    *w.word_given = false;
    return true;
  }
  bool operator()(double* v) const { return parse_double(node, *v); }
  bool operator()(bool* v) const { return parse_bool(node, *v); }
  bool operator()(std::string* v) const { return parse_string(node, *v); }
  bool operator()(std::vector<std::string>* v) const { return parse_list(node, *v, parse_string); }
  bool operator()(std::vector<int64_t>* v) const { return parse_list(node, *v, parse_int); }
  bool operator()(std::vector<double>* v) const { return parse_list(node, *v, parse_double); }
  // The mapping itself arrives only empty ({} or nothing); its entries arrive one by one
  // under their own keys (assign_named).
  bool operator()(NamedWeights* v) const {
    if (!node.IsNull() && !(node.IsMap() && node.size() == 0)) return false;
    v->clear();
    return true;
  }
};

// One entry `name: number` of a mapping field; the first entry a config gives replaces
// the default mapping.
bool assign_named(NamedWeights& v, const std::string& name, const YAML::Node& node, bool first) {
  double x = 0;
  if (!parse_double(node, x)) return false;
  if (first) v.clear();
  for (auto& [n, w] : v) {
    if (n == name) return w = x, true;
  }
  v.emplace_back(name, x);
  return true;
}

bool has_prefix(const std::string& key, const std::string& prefix) {
  return key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
         key[prefix.size()] == '.';
}

std::string join_keys(const std::vector<Field>& fields, const std::string& section) {
  std::string out;
  for (const auto& f : fields) {
    if (!has_prefix(f.key, section)) continue;
    std::string rest = f.key.substr(section.size() + 1);
    rest = rest.substr(0, rest.find('.'));
    if (out.find(rest) == std::string::npos) out += (out.empty() ? "" : ", ") + rest;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------

ConfigLoader::ConfigLoader() : layers_(std::make_unique<Layers>()) {}
ConfigLoader::~ConfigLoader() = default;

void ConfigLoader::add_file(const std::string& path) { layers_->load_file(path, Origin{}); }

void ConfigLoader::add_issue(ConfigIssue issue) { layers_->issues.push_back(std::move(issue)); }

void ConfigLoader::add_override(const Override& o) {
  Origin origin;
  origin.cli_arg = o.as_typed;
  YAML::Node value;
  try {
    value = YAML::Load(o.value);
  } catch (const YAML::Exception& e) {
    layers_->issues.push_back({o.key, fmt::format("value '{}' is not valid YAML: {}", o.value, e.msg),
                               origin, "quote it, e.g. --key='[a, b]'"});
    return;
  }
  layers_->flatten(value, o.key, origin, origin, "");
}

namespace {

// Upstream's keys and value names become ours (config/upstream.h); keys accepted with no
// effect are dropped with a note. Two entries that end up at one key must agree.
std::vector<LayeredEntry> translate_entries(const std::vector<LayeredEntry>& entries, std::vector<ConfigIssue>& issues,
                                     std::vector<std::string>& notes) {
  std::vector<LayeredEntry> out;
  std::map<std::string, std::string> written_as;  // our key -> the key the YAML used
  for (const LayeredEntry& e : entries) {
    UpstreamTranslation t = translate_upstream(e.key, e.value);
    if (!t.error.empty()) {
      issues.push_back({e.key, t.error, e.value_origin, t.hint});
      continue;
    }
    if (!t.note.empty()) notes.push_back(t.note);
    if (t.dropped) continue;
    LayeredEntry translated{t.key, t.value, e.key_origin, e.value_origin, e.written};
    auto same = std::find_if(out.begin(), out.end(), [&](const LayeredEntry& x) { return x.key == t.key; });
    if (same == out.end()) {
      written_as[t.key] = e.key;
      out.push_back(std::move(translated));
      continue;
    }
    const bool later = e.written > same->written;
    if (YAML::Dump(same->value) != YAML::Dump(t.value)) {
      notes.push_back(fmt::format("{} is set both as {} and as {}: the later one, {}, is used", t.key,
                                  written_as[t.key], e.key, later ? e.key : written_as[t.key]));
    }
    if (later) {
      written_as[t.key] = e.key;
      *same = std::move(translated);
    }
  }
  return out;
}

// An entry that names no field: its first unknown path component (a misspelt section is
// one mistake), where it was written, and the closest known key.
ConfigIssue unknown_key_issue(const LayeredEntry& e, const std::vector<std::string>& sections,
                              const std::vector<std::string>& known,
                              const std::map<std::string, Origin>& section_origins) {
  std::string unknown = e.key;
  for (size_t dot = e.key.find('.'); dot != std::string::npos; dot = e.key.find('.', dot + 1)) {
    const std::string prefix = e.key.substr(0, dot);
    if (std::find(sections.begin(), sections.end(), prefix) == sections.end()) {
      unknown = prefix;
      break;
    }
  }
  const bool is_section = unknown != e.key;
  const std::string suggestion = suggest_key(unknown, known);
  const auto section_at = section_origins.find(unknown);
  const Origin& at = is_section && section_at != section_origins.end() ? section_at->second : e.key_origin;
  return {unknown, is_section ? "unknown section" : "unknown key", at,
          suggestion.empty() ? "sana-train --list-keys shows every key" : fmt::format("did you mean {}?", suggestion)};
}

}  // namespace

Config ConfigLoader::build(const ValidationContext& ctx) const {
  Config config;
  std::vector<ConfigIssue> issues = layers_->issues;
  const std::vector<LayeredEntry> entries = translate_entries(layers_->entries, issues, config.load_notes);
  std::vector<Field> fields = fields_of(config);
  const std::vector<std::string> sections = section_keys(fields);
  std::vector<std::string> known;
  for (const auto& f : fields) known.push_back(f.key);
  known.insert(known.end(), sections.begin(), sections.end());

  OriginMap origins;
  std::set<std::string> reported;  // unknown sections and misused fields, reported once
  std::set<std::string> named_seen;  // mapping fields given entries so far
  for (const LayeredEntry& e : entries) {
    auto field = std::find_if(fields.begin(), fields.end(),
                              [&](const Field& f) { return f.key == e.key; });
    if (field != fields.end()) {
      origins[e.key] = e.value_origin;
      std::optional<std::string> unknown_name;
      if (!std::visit(Assign{e.value, unknown_name}, field->ref)) {
        issues.push_back({e.key,
                          fmt::format("expected {}, got {}", type_name(field->ref),
                                      describe_node(e.value)),
                          e.value_origin, ""});
      } else if (unknown_name) {
        issues.push_back(choice_issue(e.key, *unknown_name, field->choices, e.value_origin));
      }
      continue;
    }
    if (std::find(sections.begin(), sections.end(), e.key) != sections.end()) {
      if (e.value.IsNull() || e.value.IsMap()) continue;  // "data:" or "data: {}"
      issues.push_back({e.key,
                        fmt::format("is a section, got {}", describe_node(e.value)),
                        e.value_origin,
                        fmt::format("write it as a mapping of: {}", join_keys(fields, e.key))});
      continue;
    }
    auto owner = std::find_if(fields.begin(), fields.end(),
                              [&](const Field& f) { return has_prefix(e.key, f.key); });
    if (owner != fields.end()) {
      if (auto* named = std::get_if<NamedWeights*>(&owner->ref)) {
        const std::string name = e.key.substr(owner->key.size() + 1);
        origins[owner->key] = e.value_origin;
        if (!assign_named(**named, name, e.value, named_seen.insert(owner->key).second)) {
          issues.push_back({e.key, fmt::format("expected a number, got {}", describe_node(e.value)),
                            e.value_origin, ""});
        }
        continue;
      }
      if (reported.insert(owner->key).second) {
        issues.push_back({owner->key, fmt::format("expected {}, got a mapping",
                                                  type_name(owner->ref)),
                          e.key_origin, ""});
      }
      continue;
    }
    ConfigIssue issue = unknown_key_issue(e, sections, known, layers_->section_origins);
    if (reported.insert(issue.key).second) issues.push_back(std::move(issue));
  }

  resolve_defaults(config, origins);
  resolve_upstream_style(config, origins, ctx.world_size, issues);
  // Without all of its files the config is incomplete: checking it would report noise.
  if (!layers_->file_failed) {
    for (auto& issue : validate(config, ctx, origins)) issues.push_back(std::move(issue));
  }
  if (!issues.empty()) throw ConfigError(std::move(issues));
  return config;
}

Config load_config(const std::vector<std::string>& files, const std::vector<Override>& overrides,
                   const ValidationContext& ctx, std::vector<ConfigIssue> earlier) {
  ConfigLoader loader;
  for (auto& issue : earlier) loader.add_issue(std::move(issue));
  for (const auto& f : files) loader.add_file(f);
  for (const auto& o : overrides) loader.add_override(o);
  return loader.build(ctx);
}

// ---------------------------------------------------------------------------------------

std::vector<Override> parse_overrides(const std::vector<std::string>& words,
                                      std::vector<ConfigIssue>& issues) {
  std::vector<Override> out;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    Origin at;
    at.cli_arg = w;
    if (w.size() < 3 || w.compare(0, 2, "--") != 0) {
      issues.push_back({"", fmt::format("unexpected argument '{}'", w), at,
                        "config overrides look like --train.seed=3 or --train.seed 3"});
      continue;
    }
    const size_t eq = w.find('=');
    if (eq != std::string::npos) {
      out.push_back({w.substr(2, eq - 2), w.substr(eq + 1), w});
      continue;
    }
    const std::string key = w.substr(2);
    const bool has_value =
        i + 1 < words.size() && words[i + 1].compare(0, 2, "--") != 0;
    if (!has_value) {
      issues.push_back({key, "has no value", at,
                        fmt::format("write --{}=VALUE or --{} VALUE", key, key)});
      continue;
    }
    out.push_back({key, words[i + 1], w + " " + words[i + 1]});
    ++i;
  }
  return out;
}

}  // namespace sana::config
