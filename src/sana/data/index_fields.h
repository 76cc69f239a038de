// What every metadata source reads the same way (index_sources.cpp, index_wids.cpp): the
// column names a value may have, sizes, labels, paths relative to the metadata file. No torch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "sana/data/index_sources.h"

namespace sana::data::fields {

bool is_image_file(const std::filesystem::path& p);
std::string read_file(const std::filesystem::path& p);
std::string trim(std::string s);
// The first of `names` present in `obj` as a string (or number, as text); "" if none.
std::string json_text(const nlohmann::json& obj, std::initializer_list<const char*> names);
// A class number, -1 for ""; IndexError naming `where` otherwise.
int32_t parse_label(const std::string& text, const std::string& where);
// `p` relative to `base` unless absolute or empty.
std::string resolve(const std::filesystem::path& base, const std::string& p);
// Pixels, 0 for ""; IndexError naming `where` and `what` otherwise.
uint32_t parse_size(const std::string& text, const std::string& where, const char* what);
// Every path of `row` fits the index's 16-bit lengths; IndexError otherwise.
void check_row_paths(const IndexRow& row, const std::string& where);

}  // namespace sana::data::fields
