// The config schema: every key the YAML may hold, its type, default, bounds and help,
// described once as a list of Fields that point into a Config. Loading, printing,
// --help and --list-keys all walk this one list, so a key added here is known everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sana/config/choices.h"
#include "sana/config/config.h"

namespace sana::config {

// An enum field (config/choices.h), read and written as its name.
struct ChoiceRef {
  void* target = nullptr;
  std::vector<std::string> names;  // names[i] names the enumerator whose value is i
  size_t (*get)(const void*) = nullptr;
  void (*set)(void*, size_t) = nullptr;

  template <class E>
  static ChoiceRef of(E& value) {
    return {&value, names_of<E>(), [](const void* p) { return static_cast<size_t>(*static_cast<const E*>(p)); },
            [](void* p, size_t i) { *static_cast<E*>(p) = static_cast<E>(i); }};
  }
  std::string name() const { return names.at(get(target)); }
  // Sets the enumerator named `name`; false (nothing set) for an unknown name.
  bool set_name(const std::string& name) const;
};

// An integer that may be written as a word instead (train.micro_batch_size: auto): the word
// sets `word_given`, a number clears it; the integer's bounds apply to numbers only.
struct IntOrWord {
  int64_t* value = nullptr;
  bool* word_given = nullptr;
  std::string word;
};

using FieldRef = std::variant<int64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                              std::vector<int64_t>*, std::vector<double>*, NamedWeights*, ChoiceRef, IntOrWord>;

struct Field {
  std::string key;  // full dotted path, e.g. "train.optimizer.lr"
  FieldRef ref;
  std::string help;
  bool common = false;  // listed by --help
  std::optional<double> min;  // numeric bounds, also applied to list elements
  std::optional<double> max;
  bool min_exclusive = false;
  bool infinite = false;  // a number that may be YAML's .inf (unbounded)
  std::vector<std::string> choices;  // allowed strings (an enum's names); empty = any

  Field& at_least(double v) { min = v; min_exclusive = false; return *this; }
  Field& above(double v) { min = v; min_exclusive = true; return *this; }
  Field& at_most(double v) { max = v; return *this; }
  Field& one_of(std::vector<std::string> values) { choices = std::move(values); return *this; }
  Field& commonly_used() { common = true; return *this; }
  Field& or_infinite() { infinite = true; return *this; }
  // An integer field that also takes `word`, which sets `given` (IntOrWord).
  Field& or_word(std::string word, bool& given) {
    ref = IntOrWord{std::get<int64_t*>(ref), &given, std::move(word)};
    return *this;
  }
};

// All fields of `c`, in the order they are printed. The pointers are into `c`.
std::vector<Field> fields_of(Config& c);

// "integer", "number", "boolean", "string" (enums too), "list of strings", ...
std::string type_name(const FieldRef& ref);

// The field's current value as a one-line YAML scalar or flow sequence.
std::string value_text(const FieldRef& ref);

// Every section path ("data", "train", "train.optimizer", ...).
std::vector<std::string> section_keys(const std::vector<Field>& fields);

}  // namespace sana::config
