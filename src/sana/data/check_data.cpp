#include "sana/data/check_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string_view>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "sana/data/loader.h"
#include "sana/data/plan_coverage.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::data {

namespace {

// A TSV field: backslash, tab and line breaks written as \\, \t, \n, \r.
std::string tsv_field(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      default: out += c;
    }
  }
  return out;
}

// --dump: the bucket images and their table.
class Dump {
 public:
  explicit Dump(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    tsv_.open(dir_ / "dump.tsv");
    if (ec || !tsv_) {
      throw UsageError(fmt::format("--dump {}: cannot write there{}; name a writable folder", dir,
                                   ec ? ": " + ec.message() : ""), "usage error");
    }
    tsv_ << "id\tpath\theight\twidth\tfile\tcaption\n";
  }

  // Sample i of `b`, whose pixels are (x + 1) * 127.5 of the 8-bit values, exactly.
  void write(const DatasetIndex& index, const Batch& b, size_t i) {
    const SampleId id = b.decoded_ids[i];
    const torch::Tensor chw = b.images[static_cast<int64_t>(i)];
    const torch::Tensor hwc = ((chw + 1.0f) * 127.5f).round().clamp(0, 255).to(torch::kUInt8).permute({1, 2, 0}).contiguous();
    const int h = static_cast<int>(hwc.size(0)), w = static_cast<int>(hwc.size(1));
    cv::Mat bgr;
    cv::cvtColor(cv::Mat(h, w, CV_8UC3, hwc.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
    const std::string file = fmt::format("{:08d}.png", id);
    if (!cv::imwrite((dir_ / file).string(), bgr)) {
      throw RunError(fmt::format("--dump: could not write {}", (dir_ / file).string()), "check-data");
    }
    tsv_ << id << '\t' << tsv_field(index.text(id).path) << '\t' << h << '\t' << w << '\t' << file << '\t'
         << tsv_field(b.captions[i]) << '\n';
    if (!tsv_) throw RunError(fmt::format("--dump: could not write {}", (dir_ / "dump.tsv").string()), "check-data");
  }

 private:
  std::filesystem::path dir_;
  std::ofstream tsv_;
};

}  // namespace

CheckDataResult check_data(const CheckDataOptions& options) {
  using Clock = std::chrono::steady_clock;
  const Dataset ds = Dataset::open(options.dataset, {}, options.token_cell);
  // What training would leave out, said here too (as warnings: this command reads the data).
  check_plan_coverage(ds, ds.plan(0), "check-data", /*refuse=*/false);
  // A plan of global batches of one: every sample exactly once, in a shuffled order.
  const EpochPlan plan = EpochPlan::build(ds.members_ptr(), 1, options.dataset.seed, 0, TailPolicy::drop);
  LoaderOptions o = options.loader;
  const int64_t limit = options.limit;
  const int64_t total = limit > 0 ? std::min<int64_t>(limit, plan.steps()) : plan.steps();
  log::info("check-data: decoding {} of {} samples with {} worker{}", total, plan.steps(),
            o.workers, o.workers == 1 ? "" : "s");
  CheckDataResult r;
  if (options.fill_cache) {
    o.cache = open_disk_cache(options.disk_cache, ds);
    r.cache_path = o.cache->path();
    r.cache_ready_before = o.cache->ready_at_open();
    r.cache_bytes = static_cast<int64_t>(o.cache->bytes());
    log::info("check-data: filling {} ({}, {} samples ready before)", r.cache_path, size_text(o.cache->bytes()),
              r.cache_ready_before);
  }
  r.workers = o.workers;
  const auto start = Clock::now();
  auto last = start;
  std::optional<Dump> dump;
  if (!options.dump_dir.empty()) dump.emplace(options.dump_dir);
  Loader loader(ds, plan, o);
  while (r.samples < total) {
    auto b = loader.next();
    if (!b) break;
    if (dump) {
      for (size_t i = 0; i < b->decoded_ids.size(); ++i) dump->write(ds.index(), *b, i);
      r.dumped += static_cast<int64_t>(b->decoded_ids.size());
    }
    r.substituted += b->substituted;
    ++r.samples;
    if (Clock::now() - last > std::chrono::seconds(2)) {
      const double secs = std::chrono::duration<double>(Clock::now() - start).count();
      log::info("check-data: {}/{} samples, {:.1f} images/s, {} substituted", r.samples, total,
                r.samples / secs, r.substituted);
      last = Clock::now();
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.bad_by_reason = loader.bad_counts().by_reason;
  return r;
}

}  // namespace sana::data
