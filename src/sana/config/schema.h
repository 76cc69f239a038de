// The config schema: every key the YAML may hold, its type, default, bounds and help,
// described once as a list of Fields that point into a Config. Loading, printing,
// --help and --list-keys all walk this one list, so a key added here is known everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sana/config/config.h"

namespace sana::config {

using FieldRef = std::variant<int64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                              std::vector<int64_t>*, std::vector<double>*>;

struct Field {
  std::string key;  // full dotted path, e.g. "train.optimizer.lr"
  FieldRef ref;
  std::string help;
  bool common = false;  // listed by --help
  std::optional<double> min;  // numeric bounds, also applied to list elements
  std::optional<double> max;
  bool min_exclusive = false;
  std::vector<std::string> choices;  // allowed strings; empty = any

  Field& at_least(double v) { min = v; min_exclusive = false; return *this; }
  Field& above(double v) { min = v; min_exclusive = true; return *this; }
  Field& at_most(double v) { max = v; return *this; }
  Field& one_of(std::vector<std::string> values) { choices = std::move(values); return *this; }
  Field& commonly_used() { common = true; return *this; }
};

// All fields of `c`, in the order they are printed. The pointers are into `c`.
std::vector<Field> fields_of(Config& c);

// "integer", "number", "boolean", "string", "list of strings", ...
std::string type_name(const FieldRef& ref);

// The field's current value as a one-line YAML scalar or flow sequence.
std::string value_text(const FieldRef& ref);

// Every section path ("data", "train", "train.optimizer", ...).
std::vector<std::string> section_keys(const std::vector<Field>& fields);

}  // namespace sana::config
