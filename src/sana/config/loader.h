// Builds a Config from YAML files (with `base:` inheritance) and dotted command-line
// overrides, then validates it. Every problem found is collected and reported at once,
// each naming the full key path and where the value came from. Never includes torch.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sana/config/config.h"
#include "sana/util/error.h"

namespace sana::config {

// Where a value came from: "configs/x.yaml:12:5" or "command line --train.seed".
struct Origin {
  std::string file;     // empty for command-line values
  int line = 0;         // 1-based; 0 = unknown
  int column = 0;       // 1-based
  std::string cli_arg;  // the override as typed
  std::string describe() const;
};

struct ConfigIssue {
  std::string key;  // full dotted path; empty for file-level problems (syntax, base)
  std::string message;
  Origin origin;
  std::string hint;  // what to do, may be empty
  std::string format() const;
};

// Every problem of a config at once; what() is the first one.
class ConfigError : public sana::UsageError {
 public:
  explicit ConfigError(std::vector<ConfigIssue> issues);
  const std::vector<ConfigIssue>& issues() const { return issues_; }
  // All issues, one per line (each starting with `line_prefix`, e.g. "[rank 3] "),
  // followed by a count and what to do next.
  std::string report(const std::string& line_prefix = "") const override;

 private:
  std::vector<ConfigIssue> issues_;
};

// What validation may assume about the run.
struct ValidationContext {
  int64_t world_size = 1;
  bool check_paths = true;  // data_dir / load_from / ... must exist
  bool check_batch = true;  // global batch fits world_size (not for check-dist)
};

// One `--key.path=value` or `--key.path value` from the command line.
struct Override {
  std::string key;
  std::string value;  // YAML text: 3, 1e-4, true, [a, b], "text"
  std::string as_typed;
};

// Splits command-line words into overrides. Words that are not `--key...` forms, and
// keys with no value, become issues.
std::vector<Override> parse_overrides(const std::vector<std::string>& words,
                                      std::vector<ConfigIssue>& issues);

class ConfigLoader {
 public:
  ConfigLoader();
  ~ConfigLoader();
  ConfigLoader(const ConfigLoader&) = delete;
  ConfigLoader& operator=(const ConfigLoader&) = delete;

  // Layers a YAML file (after the files named by its `base:` key) over what is loaded.
  void add_file(const std::string& path);
  // Layers one value over everything loaded so far.
  void add_override(const Override& o);
  // Records an issue found outside the loader (e.g. a malformed override word).
  void add_issue(ConfigIssue issue);

  // Typed, defaulted, validated config; throws ConfigError listing every issue.
  Config build(const ValidationContext& ctx) const;

 private:
  struct Layers;
  std::unique_ptr<Layers> layers_;
};

// Loads files (each after its base: files) and overrides in one go, as every command does.
// `earlier` are issues found before loading (malformed override words): they are reported
// with the rest.
Config load_config(const std::vector<std::string>& files, const std::vector<Override>& overrides,
                   const ValidationContext& ctx, std::vector<ConfigIssue> earlier = {});

// The fully resolved config as YAML that loads back to the same Config.
std::string to_yaml(const Config& config);

using OriginMap = std::map<std::string, Origin>;

// Every key's value as text ("train.optimizer.lr" -> "0.001"), as to_yaml writes it:
// checkpoints keep them so a resume can say what changed.
std::map<std::string, std::string> config_values(const Config& config);
// "key: old -> new" for every key whose value differs; keys that only one side has (a
// newer or older sana-train) are left out.
std::vector<std::string> config_changes(const std::map<std::string, std::string>& before,
                                        const std::map<std::string, std::string>& after);

// A short hash of the config, leaving out keys that may differ per rank (log level,
// network interface, threads): ranks compare it at start-up.
std::string config_fingerprint(const Config& config);

// Every issue in a built config (ranges, choices, combinations, paths). `origins` says
// where each key's value came from, so messages can point at the file and line.
std::vector<ConfigIssue> validate(const Config& config, const ValidationContext& ctx,
                                  const OriginMap& origins = {});

// Fills what defaults to "the chosen option's own default" (e.g. optimizer betas).
void resolve_defaults(Config& config, const OriginMap& origins = {});

// The issue for a `value` of `key` that is not one of `choices`: it lists them and, as the
// hint, names the closest.
ConfigIssue choice_issue(const std::string& key, const std::string& value, const std::vector<std::string>& choices,
                         Origin origin);

// The closest known key to `key` (full path or last component), or "" if none is close.
std::string suggest_key(const std::string& key, const std::vector<std::string>& known);

}  // namespace sana::config
