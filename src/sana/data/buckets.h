// Aspect-ratio buckets: upstream Sana's ASPECT_RATIO_256/512/1024/2048 tables exactly,
// generated tables for any base size, and multi-scale sets of tables with a rule that
// picks one base size per sample. Pure arithmetic: no torch, no I/O, no collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sana::data {

struct Bucket {
  std::string key;  // height / width as upstream writes it ("0.25", "1.0", ...)
  double ratio = 1.0;
  int height = 0;
  int width = 0;
};

class BucketTable {
 public:
  // "ASPECT_RATIO_256" ... "_4096" (multiples of the 512 table) and "ASPECT_RATIO_2880".
  // Throws std::invalid_argument for other names.
  static BucketTable upstream(const std::string& name);
  // Heights and widths are multiples of `step`, areas close to base x base, ratios 1/4..4.
  static BucketTable generated(int base, int step);
  // One square bucket base x base (single-resolution training, model.multi_scale false).
  static BucketTable square(int base);

  int base() const { return base_; }
  const std::string& name() const { return name_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The bucket whose key is closest to height / width (ties: the smaller key, as upstream).
  int closest(int height, int width) const;

 private:
  std::string name_;
  int base_ = 0;
  std::vector<Bucket> buckets_;
};

// The square, tallest and widest bucket of a table (previews and `sana-train model`).
std::vector<Bucket> showcase_buckets(const BucketTable& table);

// How a multi-scale run picks a base size for a sample of native size h x w.
enum class ScaleRule {
  largest_fitting,  // the largest base not above sqrt(h*w); the smallest if none fits
  nearest,          // the base closest to sqrt(h*w)
  largest,          // always the largest base
};
ScaleRule parse_scale_rule(const std::string& name);  // throws std::invalid_argument

// One or more tables; a bucket id numbers every (table, bucket) pair densely.
class BucketSet {
 public:
  BucketSet(std::vector<BucketTable> tables, ScaleRule rule);

  int size() const { return static_cast<int>(offsets_.back()); }
  // The bucket id for a sample of native size h x w.
  int assign(int height, int width) const;
  const Bucket& bucket(int id) const;
  int base_of(int id) const;
  const BucketTable& table_of(int id) const;
  std::string describe(int id) const;  // "512: 1.0 -> 512x512"

 private:
  std::vector<BucketTable> tables_;  // ascending base size
  std::vector<int> offsets_;         // first id of each table, then the total
  ScaleRule rule_;
};

}  // namespace sana::data
