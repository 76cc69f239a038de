// Enumerated config options. A key whose value is one of a few names (train.optimizer.type:
// AdamW | CAME) and that code branches on is an enum in Config, parsed once by the loader;
// code compares enumerators, so a misspelt name is a compile error instead of a branch
// never taken (docs/config.md lists which options are enums). Each enum
// lists its names, in the enum's order, in a specialisation of Names<E>; the schema takes the
// key's choices (--list-keys, "is not one of" errors) from there, so a name is written once.
// Never includes torch.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sana::config {

// Specialised next to each enum: static constexpr std::array<std::string_view, N> values,
// values[i] naming the enumerator whose value is i.
template <class E>
struct Names;

// The name of `e` as the YAML writes it.
template <class E>
std::string name_of(E e) {
  return std::string(Names<E>::values[static_cast<size_t>(e)]);
}

template <class E>
std::vector<std::string> names_of() {
  return {Names<E>::values.begin(), Names<E>::values.end()};
}

}  // namespace sana::config
