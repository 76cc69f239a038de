// Knowledge that config/ does not own but validation needs: the model's presets, whether
// a bucket table tiles the model's cell. The modules that own it register checks and
// choices here; validate() and the schema use whatever is registered. config/ includes
// nothing above util/. Registration happens once at start-up (sana::register_checks in
// train/options/config_checks.h), before any config is loaded; it is not thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sana/config/config.h"

namespace sana::config {

// Where a registered check reports: the key's full dotted path, what is wrong, what to do.
class IssueSink {
 public:
  virtual ~IssueSink() = default;
  virtual void fail(const std::string& key, std::string message, std::string hint = "") = 0;
};

using Check = std::function<void(const Config&, IssueSink&)>;

// validate() runs every registered check after its own, in registration order. A second
// registration under the same name replaces the first.
void register_check(const std::string& name, Check check);
const std::vector<std::pair<std::string, Check>>& registered_checks();

// The valid values of a string key (the schema's choices and --list-keys show them).
void register_choices(const std::string& key, std::vector<std::string> values);
// Empty when nothing is registered for the key.
const std::vector<std::string>& registered_choices(const std::string& key);

}  // namespace sana::config
