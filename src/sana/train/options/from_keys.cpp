#include "sana/train/options/from_keys.h"

#include <map>
#include <stdexcept>

namespace sana::train {

namespace from_keys_detail {

void mismatch(const std::string& key, const config::FieldRef& ref) {
  const std::string type = config::type_name(ref);
  const char* article = type.find_first_of("aeiou") == 0 ? "an" : "a";
  throw std::logic_error(fmt::format("train/options: key '{}' holds {} {}, which its options field cannot take as it is",
                                     key, article, type));
}

void out_of_range(const std::string& key, int64_t value) {
  throw UsageError(fmt::format("{}: {} is out of the range this setting can hold", key, value), "config error");
}

}  // namespace from_keys_detail

void fill_from_keys(const config::Config& cfg, std::initializer_list<KeyBinding> table) {
  auto copy = cfg;  // fields_of points into a config it may write; this one is only read
  std::map<std::string, config::FieldRef> refs;
  for (const auto& f : config::fields_of(copy)) refs.emplace(f.key, f.ref);
  for (const auto& row : table) {
    const auto it = refs.find(row.key());
    if (it == refs.end()) {
      throw std::logic_error(fmt::format("train/options: a table names key '{}', which the schema (config/schema.h) "
                                         "does not have",
                                         row.key()));
    }
    row.assign(it->second);
  }
}

}  // namespace sana::train
