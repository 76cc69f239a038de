// Small text helpers shared by the config loader and the dataset indexers. Never includes
// torch.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>

namespace sana {

// `s` with ASCII letters in lower case (file extensions, YAML booleans, upstream's names).
inline std::string ascii_lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace sana
