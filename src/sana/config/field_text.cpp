// A field's type and value as the config's text shows them (`sana-train config`, the
// reference in docs/config.md, a checkpoint's recorded values).
#include <fmt/format.h>

#include <cmath>

#include "sana/config/schema.h"

namespace sana::config {

namespace {

std::string format_double(double v) {
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

template <class T, class Fn>
std::string flow_list(const std::vector<T>& values, Fn&& one) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + one(values[i]);
  return out + "]";
}

}  // namespace

std::string type_name(const FieldRef& ref) {
  struct Name {
    std::string operator()(int64_t*) const { return "integer"; }
    std::string operator()(double*) const { return "number"; }
    std::string operator()(bool*) const { return "boolean"; }
    std::string operator()(std::string*) const { return "string"; }
    std::string operator()(std::vector<std::string>*) const { return "list of strings"; }
    std::string operator()(std::vector<int64_t>*) const { return "list of integers"; }
    std::string operator()(std::vector<double>*) const { return "list of numbers"; }
    std::string operator()(NamedWeights*) const { return "mapping of names to numbers"; }
    std::string operator()(const ChoiceRef&) const { return "string"; }
    std::string operator()(const IntOrWord& w) const { return "integer or " + w.word; }
  };
  return std::visit(Name{}, ref);
}

std::string value_text(const FieldRef& ref) {
  struct Text {
    std::string operator()(int64_t* v) const { return std::to_string(*v); }
    std::string operator()(double* v) const { return format_double(*v); }
    std::string operator()(bool* v) const { return *v ? "true" : "false"; }
    std::string operator()(std::string* v) const { return quote(*v); }
    std::string operator()(std::vector<std::string>* v) const { return flow_list(*v, quote); }
    std::string operator()(std::vector<int64_t>* v) const {
      return flow_list(*v, [](int64_t x) { return std::to_string(x); });
    }
    std::string operator()(std::vector<double>* v) const { return flow_list(*v, format_double); }
    std::string operator()(NamedWeights* v) const {
      std::string out = "{";
      for (size_t i = 0; i < v->size(); ++i) {
        out += fmt::format("{}{}: {}", i ? ", " : "", quote((*v)[i].first), format_double((*v)[i].second));
      }
      return out + "}";
    }
    std::string operator()(const ChoiceRef& c) const { return quote(c.name()); }
    std::string operator()(const IntOrWord& w) const { return *w.word_given ? w.word : std::to_string(*w.value); }
  };
  return std::visit(Text{}, ref);
}

}  // namespace sana::config
