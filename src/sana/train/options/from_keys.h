// The table-driven half of the config mapping (train/options/): an options struct's fields
// filled from the config keys that name them, as the user writes them, through the
// schema's own reference to each key's value (config/schema.h). A value is converted to
// its field's type only where it fits (an integer too large for its field is a config
// error naming the key). What a key does not give as it is (one of a component's
// enumerators, a path joined, a value derived from several keys) stays a line of code
// beside the table:
//
//   CheckpointOptions o;
//   fill_from_keys(cfg, {
//       {o.save_model_steps, "train.save_model_steps"},
//       {o.keep_last_n, "ckpt.keep_last_n"},
//   });
//   o.before_stage = std::move(before_stage);
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "sana/config/config.h"
#include "sana/config/schema.h"
#include "sana/util/error.h"

namespace sana::train {

namespace from_keys_detail {

[[noreturn]] void mismatch(const std::string& key, const config::FieldRef& ref);
[[noreturn]] void out_of_range(const std::string& key, int64_t value);

// `v`, key `key`'s value, into `out`; false when out's type cannot hold a value of V's.
template <class T, class V>
bool convert(const V& v, T& out, const std::string& key) {
  if constexpr (std::is_same_v<T, V>) {
    out = v;
    return true;
  } else if constexpr (std::is_same_v<V, int64_t> && std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const bool fits = std::is_signed_v<T> ? v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                                v <= static_cast<int64_t>(std::numeric_limits<T>::max())
                                          : v >= 0 && static_cast<uint64_t>(v) <= std::numeric_limits<T>::max();
    if (!fits) out_of_range(key, v);
    out = static_cast<T>(v);
    return true;
  } else if constexpr ((std::is_same_v<V, int64_t> || std::is_same_v<V, double>) && std::is_floating_point_v<T>) {
    out = static_cast<T>(v);
    return true;
  } else if constexpr (std::is_same_v<V, std::vector<int64_t>> && std::is_same_v<T, std::vector<int>>) {
    out.clear();
    for (const int64_t x : v) convert(x, out.emplace_back(), key);
    return true;
  } else {
    return false;
  }
}

template <class T>
void assign(T& out, const config::FieldRef& ref, const std::string& key) {
  const bool done = std::visit(
      [&](const auto& source) {
        using S = std::decay_t<decltype(source)>;
        if constexpr (std::is_same_v<S, config::ChoiceRef>) {
          if constexpr (std::is_same_v<T, std::string>) {
            out = source.name();
            return true;
          } else {
            return false;  // one of a component's enumerators: a line of code maps it
          }
        } else if constexpr (std::is_same_v<S, config::IntOrWord>) {
          return convert(*source.value, out, key);
        } else {
          return convert(*source, out, key);
        }
      },
      ref);
  if (!done) mismatch(key, ref);
}

}  // namespace from_keys_detail

// One row of a table: an options field and the key whose value it takes.
class KeyBinding {
 public:
  template <class T>
  KeyBinding(T& field, const char* key)
      : key_(key), assign_([&field](const config::FieldRef& ref, const std::string& k) {
          from_keys_detail::assign(field, ref, k);
        }) {}
  const char* key() const { return key_; }
  void assign(const config::FieldRef& ref) const { assign_(ref, key_); }

 private:
  const char* key_;
  std::function<void(const config::FieldRef&, const std::string&)> assign_;
};

// Every row of `table` set from `cfg`. A key the schema lacks, or a value its field cannot
// hold by type, is a mistake in the table (std::logic_error, which every run meets at its
// start and the options test meets for every table); a value out of its field's range is
// the YAML's (UsageError naming the key).
void fill_from_keys(const config::Config& cfg, std::initializer_list<KeyBinding> table);

}  // namespace sana::train
