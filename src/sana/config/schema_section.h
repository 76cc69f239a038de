// The schema's pieces shared by its files (config/schema.cpp, schema_train.cpp): a section
// of fields under one key prefix, and the `train` section's description.
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sana/config/choices.h"
#include "sana/config/config.h"
#include "sana/config/schema.h"

namespace sana::config {

// Adds fields with a common key prefix, so each section below reads as a table.
class Section {
 public:
  Section(std::vector<Field>& out, std::string prefix) : out_(out), prefix_(std::move(prefix)) {}

  // An enum field takes its choices from its names (config/choices.h).
  template <class T>
  Field& add(const char* name, T& value, const char* help) {
    Field& f = out_.emplace_back();
    f.key = prefix_.empty() ? name : prefix_ + "." + name;
    if constexpr (std::is_enum_v<T>) {
      f.ref = ChoiceRef::of(value);
      f.choices = names_of<T>();
    } else {
      f.ref = &value;
    }
    f.help = help;
    return f;
  }

 private:
  std::vector<Field>& out_;
  std::string prefix_;
};

// Every train.* key.
void describe_train(std::vector<Field>& f, TrainConfig& t);

// SANA-Sprint's keys of each section (schema_sprint.cpp).
void describe_sprint_model(Section& s, SprintModelConfig& m);
void describe_sprint_scheduler(Section& s, SprintSchedulerConfig& sc);
void describe_sprint_train(Section& s, SprintTrainConfig& t);

}  // namespace sana::config
