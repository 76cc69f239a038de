// Loading a config from YAML text in a test, and asserting what its errors say.
#pragma once

#include "catch.h"

#include "sana/config/loader.h"
#include "test_support.h"

using namespace sana::config;
using sana::test::TempDir;

inline ValidationContext no_paths(int64_t world = 1) { return ValidationContext{world, false}; }

inline Config load_text(const TempDir& dir, const std::string& yaml, std::vector<std::string> args = {},
                 ValidationContext ctx = no_paths()) {
  std::vector<ConfigIssue> issues;
  auto overrides = parse_overrides(args, issues);
  if (!issues.empty()) throw ConfigError(issues);
  return load_config({dir.write("run.yaml", yaml)}, overrides, ctx);
}

// The issues of a config that must fail; fails the test if it loads.
inline std::vector<ConfigIssue> issues_of(const TempDir& dir, const std::string& yaml,
                                   std::vector<std::string> args = {},
                                   ValidationContext ctx = no_paths()) {
  try {
    load_text(dir, yaml, std::move(args), ctx);
  } catch (const ConfigError& e) {
    return e.issues();
  }
  FAIL("config loaded although it is invalid:\n" << yaml);
  return {};
}

inline bool mentions(const std::vector<ConfigIssue>& issues, const std::string& key,
              const std::string& fragment) {
  for (const auto& i : issues) {
    if (i.key == key && i.format().find(fragment) != std::string::npos) return true;
  }
  return false;
}
