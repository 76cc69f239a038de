// The test framework, Catch2 v2 (Debian 12) or v3 (Debian 13, for the LibTorch 2.6 check):
// one include for every test, with the v2 spellings the tests use (Approx, Catch::Contains).
#pragma once

#if SANA_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>
using Catch::Approx;
namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& text) {
  return Matchers::ContainsSubstring(text);
}
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
