#include "sana/data/buckets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>

namespace sana::data {

namespace {

// Upstream's ASPECT_RATIO_512 (key, height, width). ASPECT_RATIO_256 halves every size,
// 1024 doubles it, 2048 quadruples it and 4096 multiplies it by 8, exactly as upstream's
// tables do (its 4096 table, as diffusers' ASPECT_RATIO_4096_BIN, starts 0.25: 2048 x 8192).
struct Row {
  const char* key;
  int h, w;
};
constexpr Row kTable512[] = {
    {"0.25", 256, 1024}, {"0.26", 256, 992}, {"0.27", 256, 960}, {"0.28", 256, 928},
    {"0.32", 288, 896},  {"0.33", 288, 864}, {"0.35", 288, 832}, {"0.4", 320, 800},
    {"0.42", 320, 768},  {"0.48", 352, 736}, {"0.5", 352, 704},  {"0.52", 352, 672},
    {"0.57", 384, 672},  {"0.6", 384, 640},  {"0.68", 416, 608}, {"0.72", 416, 576},
    {"0.78", 448, 576},  {"0.82", 448, 544}, {"0.88", 480, 544}, {"0.94", 480, 512},
    {"1.0", 512, 512},   {"1.07", 512, 480}, {"1.13", 544, 480}, {"1.21", 544, 448},
    {"1.29", 576, 448},  {"1.38", 576, 416}, {"1.46", 608, 416}, {"1.67", 640, 384},
    {"1.75", 672, 384},  {"2.0", 704, 352},  {"2.09", 736, 352}, {"2.4", 768, 320},
    {"2.5", 800, 320},   {"2.89", 832, 288}, {"3.0", 864, 288},  {"3.11", 896, 288},
    {"3.62", 928, 256},  {"3.75", 960, 256}, {"3.88", 992, 256}, {"4.0", 1024, 256},
};

// Upstream's ASPECT_RATIO_2880 (from PixArt), not a multiple of the 512 table.
constexpr Row kTable2880[] = {
    {"0.25", 1408, 5760}, {"0.26", 1408, 5568}, {"0.27", 1408, 5376}, {"0.28", 1408, 5184},
    {"0.32", 1600, 4992}, {"0.33", 1600, 4800}, {"0.34", 1600, 4672}, {"0.4", 1792, 4480},
    {"0.42", 1792, 4288}, {"0.47", 1920, 4096}, {"0.49", 1920, 3904}, {"0.51", 1920, 3776},
    {"0.55", 2112, 3840}, {"0.59", 2112, 3584}, {"0.68", 2304, 3392}, {"0.72", 2304, 3200},
    {"0.78", 2496, 3200}, {"0.83", 2496, 3008}, {"0.89", 2688, 3008}, {"0.93", 2688, 2880},
    {"1.0", 2880, 2880},  {"1.07", 2880, 2688}, {"1.12", 3008, 2688}, {"1.21", 3008, 2496},
    {"1.28", 3200, 2496}, {"1.39", 3200, 2304}, {"1.47", 3392, 2304}, {"1.7", 3584, 2112},
    {"1.82", 3840, 2112}, {"2.03", 3904, 1920}, {"2.13", 4096, 1920}, {"2.39", 4288, 1792},
    {"2.5", 4480, 1792},  {"2.92", 4672, 1600}, {"3.0", 4800, 1600},  {"3.12", 4992, 1600},
    {"3.68", 5184, 1408}, {"3.82", 5376, 1408}, {"3.95", 5568, 1408}, {"4.0", 5760, 1408},
};

std::string ratio_key(double r) {
  std::string s = fmt::format("{:.2f}", r);
  while (s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

}  // namespace

BucketTable BucketTable::upstream(const std::string& name) {
  if (name == "ASPECT_RATIO_2880") {
    BucketTable t;
    t.name_ = name;
    t.base_ = 2880;
    for (const Row& r : kTable2880) t.buckets_.push_back({r.key, std::strtod(r.key, nullptr), r.h, r.w});
    return t;
  }
  static const std::map<std::string, std::pair<int, int>> scale = {
      {"ASPECT_RATIO_256", {1, 2}},
      {"ASPECT_RATIO_512", {1, 1}},
      {"ASPECT_RATIO_1024", {2, 1}},
      {"ASPECT_RATIO_2048", {4, 1}},
      {"ASPECT_RATIO_4096", {8, 1}},
  };
  auto it = scale.find(name);
  if (it == scale.end()) throw std::invalid_argument("no upstream bucket table named " + name);
  const auto [mul, div] = it->second;
  BucketTable t;
  t.name_ = name;
  t.base_ = 512 * mul / div;
  for (const Row& r : kTable512) {
    t.buckets_.push_back({r.key, std::strtod(r.key, nullptr), r.h * mul / div, r.w * mul / div});
  }
  return t;
}

BucketTable BucketTable::generated(int base, int step) {
  if (base <= 0 || step <= 0 || base % step != 0) {
    throw std::invalid_argument(
        fmt::format("generated buckets need a base size that is a multiple of the step "
                    "(base {}, step {})",
                    base, step));
  }
  BucketTable t;
  t.name_ = fmt::format("generated_{}_step{}", base, step);
  t.base_ = base;
  const double area = static_cast<double>(base) * base;
  std::map<std::string, Bucket> by_key;  // ascending key order, one bucket per key
  for (int h = step; h <= 4 * base; h += step) {
    const int w = std::max(step, static_cast<int>(std::lround(area / h / step)) * step);
    const double r = static_cast<double>(h) / w;
    if (r < 0.25 - 1e-9 || r > 4.0 + 1e-9) continue;
    const std::string key = ratio_key(r);
    const Bucket b{key, std::strtod(key.c_str(), nullptr), h, w};
    auto [pos, fresh] = by_key.emplace(key, b);
    // Two sizes rounding to one key: keep the one whose area is closer to base x base.
    if (!fresh && std::abs(static_cast<double>(h) * w - area) <
                      std::abs(static_cast<double>(pos->second.height) * pos->second.width - area)) {
      pos->second = b;
    }
  }
  for (auto& [key, b] : by_key) t.buckets_.push_back(b);
  std::sort(t.buckets_.begin(), t.buckets_.end(),
            [](const Bucket& a, const Bucket& b) { return a.ratio < b.ratio; });
  return t;
}

BucketTable BucketTable::square(int base) {
  BucketTable t;
  t.name_ = fmt::format("square_{}", base);
  t.base_ = base;
  t.buckets_.push_back({"1.0", 1.0, base, base});
  return t;
}

std::vector<Bucket> showcase_buckets(const BucketTable& table) {
  const auto& b = table.buckets();
  const auto wider = [](const Bucket& x, const Bucket& y) {
    return static_cast<double>(x.width) * y.height < static_cast<double>(y.width) * x.height;
  };
  const auto square = std::min_element(b.begin(), b.end(), [](const Bucket& x, const Bucket& y) {
    return std::abs(std::log(x.ratio)) < std::abs(std::log(y.ratio));
  });
  const auto [tall, wide] = std::minmax_element(b.begin(), b.end(), wider);
  std::vector<Bucket> out;
  for (auto it : {square, tall, wide}) {
    if (std::none_of(out.begin(), out.end(), [&](const Bucket& o) { return o.key == it->key; })) {
      out.push_back(*it);
    }
  }
  return out;
}

int BucketTable::closest(int height, int width) const {
  const double r = static_cast<double>(height) / std::max(1, width);
  int best = 0;
  double best_d = std::abs(buckets_[0].ratio - r);
  for (size_t i = 1; i < buckets_.size(); ++i) {
    const double d = std::abs(buckets_[i].ratio - r);
    if (d < best_d) {
      best_d = d;
      best = static_cast<int>(i);
    }
  }
  return best;
}

ScaleRule parse_scale_rule(const std::string& name) {
  if (name == "largest_fitting") return ScaleRule::largest_fitting;
  if (name == "nearest") return ScaleRule::nearest;
  if (name == "largest") return ScaleRule::largest;
  throw std::invalid_argument("unknown multi-scale rule " + name);
}

BucketSet::BucketSet(std::vector<BucketTable> tables, ScaleRule rule)
    : tables_(std::move(tables)), rule_(rule) {
  if (tables_.empty()) throw std::invalid_argument("a bucket set needs at least one table");
  std::sort(tables_.begin(), tables_.end(),
            [](const BucketTable& a, const BucketTable& b) { return a.base() < b.base(); });
  offsets_.push_back(0);
  for (const auto& t : tables_) {
    offsets_.push_back(offsets_.back() + static_cast<int>(t.buckets().size()));
  }
}

int BucketSet::assign(int height, int width) const {
  size_t table = tables_.size() - 1;
  const double native = std::sqrt(static_cast<double>(height) * width);
  if (rule_ == ScaleRule::largest_fitting) {
    table = 0;
    for (size_t i = 0; i < tables_.size(); ++i) {
      if (tables_[i].base() <= native) table = i;
    }
  } else if (rule_ == ScaleRule::nearest) {
    double best = 1e300;
    for (size_t i = 0; i < tables_.size(); ++i) {
      const double d = std::abs(tables_[i].base() - native);
      if (d < best) {
        best = d;
        table = i;
      }
    }
  }
  return offsets_[table] + tables_[table].closest(height, width);
}

const Bucket& BucketSet::bucket(int id) const {
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), id) - 1;
  const size_t table = static_cast<size_t>(it - offsets_.begin());
  return tables_[table].buckets()[static_cast<size_t>(id - *it)];
}

const BucketTable& BucketSet::table_of(int id) const {
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), id) - 1;
  return tables_[static_cast<size_t>(it - offsets_.begin())];
}

int BucketSet::base_of(int id) const { return table_of(id).base(); }

std::string BucketSet::describe(int id) const {
  const Bucket& b = bucket(id);
  return fmt::format("{}: {} -> {}x{}", base_of(id), b.key, b.height, b.width);
}

}  // namespace sana::data
