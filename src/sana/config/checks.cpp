#include "sana/config/checks.h"

#include <map>

namespace sana::config {

namespace {

std::vector<std::pair<std::string, Check>>& checks() {
  static std::vector<std::pair<std::string, Check>> all;
  return all;
}

std::map<std::string, std::vector<std::string>>& choices() {
  static std::map<std::string, std::vector<std::string>> all;
  return all;
}

}  // namespace

void register_check(const std::string& name, Check check) {
  for (auto& [n, c] : checks()) {
    if (n == name) {
      c = std::move(check);
      return;
    }
  }
  checks().emplace_back(name, std::move(check));
}

const std::vector<std::pair<std::string, Check>>& registered_checks() { return checks(); }

void register_choices(const std::string& key, std::vector<std::string> values) { choices()[key] = std::move(values); }

const std::vector<std::string>& registered_choices(const std::string& key) {
  static const std::vector<std::string> none;
  const auto it = choices().find(key);
  return it == choices().end() ? none : it->second;
}

}  // namespace sana::config
