// The loader on real photos plus bad files: plan order, contents independent of the
// number of workers, every rank's slice, substitutes from the same bucket, clean stops.
#include "catch.h"
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "loader_fixture.h"
#include "sana/data/loader.h"
#include "test_support.h"

using namespace sana::test;

TEST_CASE("batches follow the plan and do not depend on the number of workers", "[loader]") {
  Fixture fx;
  const auto plan = fx.dataset->plan(1);
  REQUIRE(plan.steps() >= 3);
  Loader one(*fx.dataset, plan, fx.options(1));
  Loader three(*fx.dataset, plan, fx.options(3));
  const auto a = drain(one), b = drain(three);
  REQUIRE(a.size() == static_cast<size_t>(plan.steps() * 2));  // 2 micro-steps per step
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("micro-batch " << i);
    const auto planned = plan.batch(a[i].step).ids;
    CHECK(a[i].micro_count == 2);
    CHECK(a[i].ids == std::vector<SampleId>(planned.begin() + 2 * a[i].micro_step, planned.begin() + 2 * a[i].micro_step + 2));
    CHECK(a[i].decoded_ids == b[i].decoded_ids);
    CHECK(torch::equal(a[i].images, b[i].images));
    const Bucket& bucket = fx.dataset->buckets().bucket(a[i].bucket);
    CHECK(a[i].images.sizes() == torch::IntArrayRef({2, 3, bucket.height, bucket.width}));
    CHECK(a[i].images.min().item<float>() >= -1.0f);
    CHECK(a[i].images.max().item<float>() <= 1.0f);
  }
  CHECK(one.wait_seconds() >= 0);
}

TEST_CASE("bad files are replaced from the same bucket and counted by reason", "[loader]") {
  Fixture fx;
  // The whole corpus of bad files (written by PIL and by hand) goes through the loader.
  const TempDir& corpus = sana::test::reference_fixtures("make_image_fixtures.py");
  int bad_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(corpus.path())) {
    if (e.is_regular_file() && e.path().filename().string().rfind("bad_", 0) == 0) {
      std::filesystem::copy_file(e.path(), fx.dir.path("images/" + e.path().filename().string()));
      ++bad_files;
    }
  }
  CHECK(bad_files >= 8);
  fx.dataset = std::make_unique<Dataset>(Dataset::open(fx.dataset_options));
  // A file deleted after indexing (e.g. by a clean-up job during training).
  std::filesystem::remove(fx.dir.path("images/Storm.jpg"));
  const auto plan = fx.dataset->plan(0);  // tail pad: every sample appears
  Loader loader(*fx.dataset, plan, fx.options(2));
  int substituted = 0;
  for (const auto& b : drain(loader)) {
    substituted += b.substituted;
    for (size_t i = 0; i < b.ids.size(); ++i) {
      CHECK(fx.dataset->bucket_of(b.decoded_ids[i]) == b.bucket);
      const auto path = std::string(fx.dataset->index().text(b.decoded_ids[i]).path);
      CHECK(path.find("zero.jpg") == std::string::npos);
      CHECK(path.find("words.png") == std::string::npos);
      CHECK(path.find("cut.jpg") == std::string::npos);
      CHECK(path.find("bad_") == std::string::npos);
    }
  }
  auto counts = loader.bad_counts();
  CHECK(counts.by_reason["empty"] >= 2);
  CHECK(counts.by_reason["not an image"] >= 4);
  CHECK(counts.by_reason["truncated"] >= 3);
  CHECK(counts.by_reason["corrupt"] >= 1);
  CHECK(counts.by_reason["too large"] >= 1);
  CHECK(counts.by_reason["missing"] >= 1);
  CHECK(substituted >= 4 + bad_files);
  CHECK(counts.substituted == substituted);
}

TEST_CASE("each rank decodes its own slice, together they make the global batch", "[loader]") {
  Fixture fx;
  const auto plan = fx.dataset->plan(2);
  Loader whole(*fx.dataset, plan, fx.options(2, 0, 1, 4));
  Loader r0(*fx.dataset, plan, fx.options(1, 0, 2, 1));
  Loader r1(*fx.dataset, plan, fx.options(2, 1, 2, 1));
  const auto w = drain(whole), a = drain(r0), b = drain(r1);
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == 2 * w.size());  // micro-batch 1 x 2 accumulation on 2 ranks
  for (size_t s = 0; s < w.size(); ++s) {
    std::multiset<SampleId> joined;
    for (size_t t = 0; t < 2; ++t) {
      joined.insert(a[2 * s + t].decoded_ids.begin(), a[2 * s + t].decoded_ids.end());
      joined.insert(b[2 * s + t].decoded_ids.begin(), b[2 * s + t].decoded_ids.end());
    }
    CHECK(joined == std::multiset<SampleId>(w[s].decoded_ids.begin(), w[s].decoded_ids.end()));
  }
}

TEST_CASE("a loader stopped mid-epoch or resumed mid-epoch behaves", "[loader]") {
  Fixture fx;
  const auto plan = fx.dataset->plan(0);
  {
    Loader loader(*fx.dataset, plan, fx.options(3));
    CHECK(loader.next().has_value());
  }  // the destructor stops three workers with a full queue
  Loader resumed(*fx.dataset, plan, fx.options(2), 2);
  const auto first = resumed.next();
  REQUIRE(first.has_value());
  CHECK(first->step == 2);
  const auto planned = plan.batch(2).ids;
  CHECK(first->ids == std::vector<SampleId>(planned.begin(), planned.begin() + 2));
}

TEST_CASE("the sample cache serves later epochs to any rank with the bytes of a fresh decode", "[loader][cache]") {
  Fixture fx;  // real photos and three bad files
  const auto path = fx.dir.path("samples.cache");
  // Two ranks' views of one shared file, as two processes on a node open it.
  auto mine = std::make_shared<SampleCache>(path, cache_shape(*fx.dataset));
  auto theirs = std::make_shared<SampleCache>(path, cache_shape(*fx.dataset));
  mine->unlink();  // the name goes; both mappings stay
  CHECK_FALSE(std::filesystem::exists(path));
  int64_t good_misses_after_first_epoch = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto plan = fx.dataset->plan(epoch);  // tail pad: every sample, dealt to ranks anew
    for (int rank = 0; rank < 2; ++rank) {
      auto cache = rank == 0 ? mine : theirs;
      const int64_t misses_before = cache->misses();
      Loader plain(*fx.dataset, plan, fx.options(2, rank, 2, 1));
      auto with_cache = fx.options(2, rank, 2, 1);
      with_cache.cache = cache;
      Loader cached(*fx.dataset, plan, with_cache);
      const auto a = drain(plain), b = drain(cached);
      REQUIRE(a.size() == b.size());
      int64_t bad_reads = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("epoch " << epoch << " rank " << rank << " micro-batch " << i);
        CHECK(a[i].decoded_ids == b[i].decoded_ids);
        CHECK(torch::equal(a[i].images, b[i].images));  // flips included
        bad_reads += static_cast<int64_t>(b[i].bad_reasons.size());
      }
      if (epoch > 0) good_misses_after_first_epoch += cache->misses() - misses_before - bad_reads;
    }
  }
  CHECK(good_misses_after_first_epoch == 0);  // bad files are tried again; nothing good is decoded twice
  CHECK(mine->hits() > 0);
  CHECK(theirs->hits() > 0);
  CHECK(mine->bytes() == SampleCache::bytes_needed(cache_shape(*fx.dataset)));
}

TEST_CASE("the sample cache keeps only images of their own bucket's size", "[loader][cache]") {
  TempDir dir;
  SampleCache::Shape shape{{0, 1, 0}, {{2, 3}, {4, 1}}};
  SampleCache cache(dir.path("c"), shape);
  CHECK(SampleCache::bytes_needed(shape) == 64 + 64 + 64 + 3 * 64);  // header, states, checksums, slots
  cv::Mat small(2, 3, CV_8UC3, cv::Scalar(1, 2, 3));
  cache.put(1, small);  // sample 1's bucket is 4 x 1: not kept
  CHECK(cache.get(1, 2, 3).empty());
  CHECK(cache.get(1, 4, 1).empty());
  cache.put(2, small);
  cv::Mat other(2, 3, CV_8UC3, cv::Scalar(9, 9, 9));
  cache.put(2, other);  // the first image stays
  const cv::Mat got = cache.get(2, 2, 3);
  REQUIRE_FALSE(got.empty());
  CHECK(got.at<cv::Vec3b>(1, 2) == cv::Vec3b(1, 2, 3));
  CHECK(cache.get(2, 3, 2).empty());  // asked at another size
  CHECK(cache.get(0, 2, 3).empty());  // never stored
  CHECK(cache.get(7, 2, 3).empty());  // no such sample
  CHECK(cache.hits() == 1);
}

namespace {
// Writes `bytes` at `offset` of the file, as a crash or a bad disk leaves it.
void scribble(const std::string& path, long offset, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  REQUIRE(f != nullptr);
  std::fseek(f, offset, SEEK_SET);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}
}  // namespace

TEST_CASE("a kept sample cache serves later runs and decodes again what did not reach the disk whole",
          "[loader][cache]") {
  TempDir dir;
  const auto path = dir.path("samples.cache");
  SampleCache::Shape shape{{0, 0, 0}, {{2, 3}}};
  const cv::Mat a(2, 3, CV_8UC3, cv::Scalar(1, 2, 3)), b(2, 3, CV_8UC3, cv::Scalar(4, 5, 6));
  {
    SampleCache first(path, shape, 7, /*kept=*/true);
    CHECK(first.ready_at_open() == 0);
    first.put(0, a);
    first.put(1, b);
    first.put(2, a);
  }
  // Sample 1's pixels damaged; sample 2 left mid-write (state byte 1) by a killed writer.
  const long slots = 64 + 64 + 64;
  scribble(path, slots + 64 + 5, "\x7f");
  scribble(path, 64 + 2, std::string(1, '\x01'));
  SampleCache later(path, shape, 7, /*kept=*/true);
  CHECK(later.ready_at_open() == 2);  // 0 and 1; 2 was emptied
  const cv::Mat got = later.get(0, 2, 3);
  REQUIRE_FALSE(got.empty());
  CHECK(cv::norm(got, a, cv::NORM_INF) == 0);
  CHECK(later.get(1, 2, 3).empty());  // its checksum does not match: decode it again
  CHECK(later.get(2, 2, 3).empty());
  later.put(1, b);
  later.put(2, b);
  CHECK(cv::norm(later.get(1, 2, 3), b, cv::NORM_INF) == 0);
  CHECK(cv::norm(later.get(2, 2, 3), b, cv::NORM_INF) == 0);
  // A second user while this one has it open sees the same slots.
  SampleCache other(path, shape, 7, /*kept=*/true);
  CHECK(other.ready_at_open() == 3);
  // Another key for the same path while it is in use: refused, not overwritten.
  CHECK_THROWS_WITH(SampleCache(path, shape, 8, true), Catch::Contains("in use by another run"));
}

TEST_CASE("a kept sample cache of other data or settings is started afresh", "[loader][cache]") {
  TempDir dir;
  const auto path = dir.path("samples.cache");
  SampleCache::Shape shape{{0, 0}, {{2, 3}}};
  {
    SampleCache first(path, shape, 7, /*kept=*/true);
    first.put(0, cv::Mat(2, 3, CV_8UC3, cv::Scalar(1, 2, 3)));
  }
  {
    SampleCache again(path, shape, 8, /*kept=*/true);  // nobody else has it open
    CHECK(again.ready_at_open() == 0);
    CHECK(again.get(0, 2, 3).empty());
  }
  SampleCache::Shape bigger{{0, 0, 0}, {{2, 3}}};
  SampleCache grown(path, bigger, 8, /*kept=*/true);  // another size: started afresh too
  CHECK(grown.ready_at_open() == 0);
  CHECK(grown.bytes() == SampleCache::bytes_needed(bigger));
}
