// c10d::Store values are bytes; the run's keys hold text (counters, names, reasons).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sana::dist::store_value {

inline std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace sana::dist::store_value
