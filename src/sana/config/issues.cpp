// How config problems are worded: origins, one-line issues, the final report, and
// did-you-mean suggestions.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "sana/config/loader.h"

namespace sana::config {

std::string Origin::describe() const {
  if (!cli_arg.empty()) return fmt::format("command line '{}'", cli_arg);
  if (file.empty()) return "";
  if (line <= 0) return file;
  return fmt::format("{}:{}:{}", file, line, column);
}

std::string ConfigIssue::format() const {
  std::string out = "config error: ";
  if (!key.empty()) out += key + ": ";
  out += message;
  const std::string where = origin.describe();
  if (!where.empty()) out += " (" + where + ")";
  if (!hint.empty()) out += "; " + hint;
  return out;
}

namespace {
std::string summary(const std::vector<ConfigIssue>& issues) {
  return issues.empty() ? "config error" : issues.front().format();
}
}  // namespace

ConfigError::ConfigError(std::vector<ConfigIssue> issues)
    : UsageError(summary(issues), "config error"), issues_(std::move(issues)) {}

std::string ConfigError::report(const std::string& line_prefix) const {
  std::string out;
  for (const auto& issue : issues_) out += line_prefix + issue.format() + "\n";
  out += line_prefix;
  out += fmt::format("{} config error{} found; nothing was started. "
                     "Fix the config (sana-train --list-keys shows every key) and run again.\n",
                     issues_.size(), issues_.size() == 1 ? "" : "s");
  return out;
}

namespace {

// Optimal string alignment distance: edits, with adjacent transpositions counting as one.
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string last_component(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

}  // namespace

std::string suggest_key(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::string::npos;
  const std::string leaf = last_component(key);
  for (const auto& candidate : known) {
    // A whole-path near miss (train.optimzer.lr) and a key put in the wrong section
    // (model.resume_from) are both worth suggesting; the former wins ties.
    const size_t full = edit_distance(key, candidate);
    const size_t by_leaf = edit_distance(leaf, last_component(candidate)) + 1;
    const size_t d = std::min(full, by_leaf);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  const size_t limit = std::max<size_t>(2, leaf.size() / 3);
  return best_distance <= limit ? best : "";
}

ConfigIssue choice_issue(const std::string& key, const std::string& value, const std::vector<std::string>& choices,
                         Origin origin) {
  const std::string close = suggest_key(value, choices);
  return {key, fmt::format("'{}' is not one of: {}", value, fmt::join(choices, ", ")), std::move(origin),
          close.empty() ? "" : fmt::format("did you mean {}?", close)};
}

}  // namespace sana::config
