// Bucket tables: upstream's four tables entry by entry (against the facts file in
// tests/data), the closest-key rule, generated tables and multi-scale assignment.
#include "catch.h"

#include <cmath>
#include <fstream>
#include <regex>
#include <set>

#include "sana/data/buckets.h"

using namespace sana::data;

TEST_CASE("upstream bucket tables, every entry", "[buckets]") {
  std::ifstream facts(std::string(SANA_SOURCE_DIR) + "/tests/data/aspect_ratio_tables.md");
  REQUIRE(facts.good());
  std::string line, table;
  int checked = 0;
  const std::regex heading(R"(^## (ASPECT_RATIO_\d+).*)");
  const std::regex row(R"(^\| ([0-9.]+) \| (\d+) \| (\d+) \|$)");
  std::map<std::string, int> rows;
  while (std::getline(facts, line)) {
    std::smatch m;
    if (std::regex_match(line, m, heading)) table = m[1];
    if (!std::regex_match(line, m, row)) continue;
    const auto t = BucketTable::upstream(table);
    const int i = rows[table]++;
    REQUIRE(i < static_cast<int>(t.buckets().size()));
    const Bucket& b = t.buckets()[static_cast<size_t>(i)];
    INFO(table << " row " << i);
    CHECK(b.key == m[1].str());
    CHECK(b.height == std::stoi(m[2]));
    CHECK(b.width == std::stoi(m[3]));
    ++checked;
  }
  CHECK(checked == 160);
  for (const auto& [name, count] : rows) CHECK(count == 40);
  CHECK_THROWS(BucketTable::upstream("ASPECT_RATIO_768"));
}

TEST_CASE("the closest key wins",
          "[buckets]") {
  const auto t = BucketTable::upstream("ASPECT_RATIO_512");
  auto key = [&](int h, int w) { return t.buckets()[static_cast<size_t>(t.closest(h, w))].key; };
  CHECK(key(512, 512) == "1.0");
  CHECK(key(3172, 5640) == "0.57");  // a 16:9 photo (0.5624...) -> 384x672
  CHECK(key(1080, 1920) == "0.57");
  CHECK(key(100, 1000) == "0.25");   // beyond the table clamps to its end
  CHECK(key(1000, 100) == "4.0");
  CHECK(key(1, 2) == "0.5");
  CHECK(key(57, 100) == "0.57");
  CHECK(key(148, 100) == "1.46");
}

TEST_CASE("generated tables: multiples of the step, area near base^2, ratios 1/4..4",
          "[buckets]") {
  for (int base : {32, 64, 96, 256}) {
    for (int step : {8, 16, 32}) {
      if (base % step != 0) continue;
      const auto t = BucketTable::generated(base, step);
      INFO("base " << base << " step " << step);
      REQUIRE(!t.buckets().empty());
      std::set<std::string> keys;
      double last = 0;
      bool has_square = false;
      for (const auto& b : t.buckets()) {
        CHECK(b.height % step == 0);
        CHECK(b.width % step == 0);
        CHECK(b.ratio >= 0.25);
        CHECK(b.ratio <= 4.0);
        CHECK(b.ratio > last);
        last = b.ratio;
        CHECK(keys.insert(b.key).second);
        const double area = static_cast<double>(b.height) * b.width;
        CHECK(std::abs(area - base * base) <= static_cast<double>(step) * std::max(b.height, b.width));
        has_square = has_square || (b.height == base && b.width == base);
      }
      CHECK(has_square);
    }
  }
  CHECK_THROWS_WITH(BucketTable::generated(100, 32), Catch::Contains("multiple of the step"));
}

TEST_CASE("multi-scale: one base size per sample by the configured rule", "[buckets]") {
  std::vector<BucketTable> tables = {BucketTable::upstream("ASPECT_RATIO_1024"),
                                     BucketTable::upstream("ASPECT_RATIO_256"),
                                     BucketTable::upstream("ASPECT_RATIO_512")};
  const BucketSet fitting(tables, ScaleRule::largest_fitting);
  CHECK(fitting.size() == 120);
  CHECK(fitting.base_of(fitting.assign(300, 300)) == 256);   // native 300: 256 fits
  CHECK(fitting.base_of(fitting.assign(800, 800)) == 512);
  CHECK(fitting.base_of(fitting.assign(3172, 5640)) == 1024);
  CHECK(fitting.base_of(fitting.assign(100, 100)) == 256);   // nothing fits: the smallest
  CHECK(fitting.describe(fitting.assign(3172, 5640)) == "1024: 0.57 -> 768x1344");
  const BucketSet nearest(tables, ScaleRule::nearest);
  CHECK(nearest.base_of(nearest.assign(800, 800)) == 1024);  // |1024-800| < |512-800|
  const BucketSet largest(tables, ScaleRule::largest);
  CHECK(largest.base_of(largest.assign(100, 100)) == 1024);
}
