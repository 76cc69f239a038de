// Precomputed latents and caption features: the .npy and safetensors readers, and the
// loader serving them in place of pixels, with bad files substituted like bad images.
#include "catch.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>

#include "sana/data/loader.h"
#include "sana/data/tensor_file.h"
#include "test_support.h"

using namespace sana::data;
using sana::test::TempDir;

namespace {
const TempDir& features() { return sana::test::reference_fixtures("make_feature_fixtures.py"); }

// The fixtures' 12 samples of one size (24x40, one bucket at 32 px), 4 per step.
DatasetOptions feature_config(const std::string& meta, const std::string& work_dir) {
  DatasetOptions o;
  o.sources = {meta};
  o.index_dir = work_dir + "/index";
  o.buckets.base_sizes = {32};
  o.buckets.aspect_ratio_type = "generated";
  o.buckets.bucket_step = 8;
  o.batch.global_batch = 4;
  o.seed = 42;  // train.seed's default
  return o;
}

// Two workers serving the fixtures' latents: 4 channels, 24x40 bucket -> 6x10.
LoaderOptions latent_options() {
  LoaderOptions o;
  o.micro_batch = 2;
  o.workers = 2;
  o.load_latents = true;
  o.latent_channels = 4;
  o.latent_downsample = 4;
  return o;
}
}  // namespace

TEST_CASE("npy and safetensors files read as float32 tensors", "[features]") {
  const auto& d = features();
  const auto half = read_tensor_file(d.path("half.npy"));
  CHECK(half.sizes() == torch::IntArrayRef({2, 3}));
  CHECK(half.dtype() == torch::kFloat32);
  CHECK(half[1][2].item<float>() == 5.0f);
  const auto lat = read_tensor_file(d.path("lat0.safetensors"));
  CHECK(lat.sizes() == torch::IntArrayRef({4, 6, 10}));
  const auto bf16 = read_tensor_file(d.path("two.safetensors"), "a");
  CHECK(bf16[3].item<float>() == 3.0f);
  CHECK(read_tensor_file(d.path("two.safetensors"), "b")[1].item<float>() == 1.0f);
  CHECK_THROWS_WITH(read_tensor_file(d.path("two.safetensors")), Catch::Contains("several arrays"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("lat3.npy")), Catch::Contains("truncated"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("ints.npy")), Catch::Contains("floating point"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("fortran.npy")), Catch::Contains("Fortran order"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("big.npy")), Catch::Contains("big-endian"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("empty.npy")), Catch::Contains("is empty"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("none.npy")), Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("meta.jsonl")), Catch::Contains("neither .npy, .npz nor"));
}

TEST_CASE("the loader serves precomputed latents and caption features", "[features][loader]") {
  const auto& d = features();
  TempDir work;
  const auto ds = Dataset::open(feature_config(d.path("meta.jsonl"), work.path()));
  const auto plan = ds.plan(0);
  REQUIRE(plan.steps() == 3);  // 12 samples of one size: one bucket (0.6: 24x40)
  LoaderOptions o = latent_options();
  o.load_text_feat = true;
  o.text_length = 8;
  o.text_channels = 6;
  Loader loader(ds, plan, o);
  int substituted = 0;
  while (auto b = loader.next()) {
    REQUIRE(b->latents.sizes() == torch::IntArrayRef({2, 4, 6, 10}));
    CHECK_FALSE(b->images.defined());
    for (int i = 0; i < 2; ++i) {
      const auto used = static_cast<float>(b->decoded_ids[static_cast<size_t>(i)]);
      CHECK(b->latents[i].min().item<float>() == used);  // the file's contents
      CHECK(b->latents[i].max().item<float>() == used);
      CHECK(b->text_feat[i][4][5].item<float>() == used);
      CHECK(b->text_feat[i][7][5].item<float>() == used);  // padded with the last token, as upstream
      CHECK(b->text_mask[i].sum().item<float>() == 5.0f);
      CHECK(b->decoded_ids[static_cast<size_t>(i)] != 3);
      CHECK(b->decoded_ids[static_cast<size_t>(i)] != 5);
    }
    substituted += b->substituted;
  }
  auto counts = loader.bad_counts();
  CHECK(counts.by_reason["unreadable latent"] >= 1);
  CHECK(counts.by_reason["wrong latent shape"] >= 1);
  CHECK(substituted == 2);
}

TEST_CASE("caption features in upstream's .npz: caption_feature and attention_mask", "[features]") {
  const auto& d = features();
  for (const char* name : {"txt_stored.npz", "txt_compressed.npz"}) {
    INFO(name);
    const TextFeatures t = read_text_features(d.path(name));
    REQUIRE(t.features.sizes() == torch::IntArrayRef({3, 6}));  // (1, T, C) -> (T, C)
    CHECK(t.features[2][5].item<float>() == 17.0f);
    REQUIRE(t.mask.defined());
    CHECK(torch::equal(t.mask, torch::tensor({1.0f, 1.0f, 0.0f})));  // int16 on disk
  }
  CHECK_FALSE(read_text_features(d.path("txt_nomask.npz")).mask.defined());
  CHECK(read_text_features(d.path("txt0.npy")).features.sizes() == torch::IntArrayRef({5, 6}));
  CHECK(read_tensor_file(d.path("lat_z.npz"))[3][5][9].item<float>() == 7.0f);  // key "z"
  CHECK(read_tensor_file(d.path("two.npz"), "b").sizes() == torch::IntArrayRef({3}));
  CHECK_THROWS_WITH(read_tensor_file(d.path("two.npz")), Catch::Contains("several arrays (a, b)"));
  CHECK_THROWS_WITH(read_tensor_file(d.path("two.npz"), "c"), Catch::Contains("no array 'c'"));
  CHECK_THROWS_AS(read_text_features(d.path("damaged.npz")), TensorFileError);
  CHECK_THROWS_WITH(read_text_features(d.path("cut.npz")), Catch::Contains("truncated"));
}

TEST_CASE("upstream's wids shards serve latents and caption features as SanaWebDatasetMS does",
          "[features][loader]") {
  const auto& d = features();
  TempDir work;
  const auto ds = Dataset::open(feature_config(d.path("wids"), work.path()));
  const auto plan = ds.plan(0);
  REQUIRE(plan.steps() == 2);  // 8 samples of 40x24 in two shards
  LoaderOptions o = latent_options();
  o.load_text_feat = true;
  o.text_length = 6;
  o.text_channels = 6;
  Loader loader(ds, plan, o);
  std::set<SampleId> seen;
  while (auto b = loader.next()) {
    CHECK(b->substituted == 0);
    for (int i = 0; i < 2; ++i) {
      const SampleId id = b->decoded_ids[static_cast<size_t>(i)];
      const auto v = static_cast<float>(id);
      seen.insert(id);
      CHECK(b->latents[i].min().item<float>() == v);  // (C, h, w) and (1, C, h, w) alike
      CHECK(b->latents[i].max().item<float>() == v);
      const int64_t t = 2 + static_cast<int64_t>(id) % 3;  // tokens on disk; the last masked
      CHECK(b->text_mask[i].sum().item<float>() == static_cast<float>(t - 1));
      CHECK(b->text_mask[i][t - 1].item<float>() == 0.0f);
      CHECK(b->text_feat[i][0][0].item<float>() == v);
      // Filled to model_max_length with the last token (100 + i) under mask 0, as upstream.
      CHECK(b->text_feat[i][5][3].item<float>() == 100.0f + v);
    }
  }
  CHECK(seen.size() == 8);
  o.text_length = 3;  // fewer than samples 2 and 5 have: bad samples, never silently cut
  Loader short_text(ds, plan, o);
  while (short_text.next()) {
  }
  CHECK(short_text.bad_counts().by_reason["too many text tokens"] == 2);
}

TEST_CASE("a read that never returns fails the loader in time, and its destructor does not hang",
          "[features][loader]") {
  namespace fs = std::filesystem;
  const auto& d = features();
  // The fixtures with every latent file a FIFO: opening one for reading blocks until a writer
  // comes, which none does, like a read from a hung network file system.
  TempDir data, work;
  for (const auto& e : fs::directory_iterator(d.path())) {
    const std::string name = e.path().filename().string();
    if (e.is_directory()) continue;
    if (name.rfind("lat", 0) == 0) {
      REQUIRE(mkfifo(data.path(name).c_str(), 0600) == 0);
    } else {
      fs::copy_file(e.path(), data.path(name));
    }
  }
  const auto ds = Dataset::open(feature_config(data.path("meta.jsonl"), work.path()));
  const auto plan = ds.plan(0);
  LoaderOptions o = latent_options();
  o.wait_timeout_s = 1;
  o.stop_wait_s = 1;
  auto loader = std::make_unique<Loader>(ds, plan, o);
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  CHECK_THROWS_WITH(loader->next(), Catch::Contains("no batch decoded within 1 s") && Catch::Contains("stuck"));
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(waited >= 1.0);
  CHECK(waited < 10.0);
  start = Clock::now();
  const auto threads = [] {
    return std::distance(fs::directory_iterator("/proc/self/task"), fs::directory_iterator());
  };
  const auto before = threads();
  loader.reset();  // both workers are still inside open(): they are left behind, not joined
  const double stopped = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(stopped >= 1.0);
  CHECK(stopped < 10.0);
  // The file system comes back: each left-behind worker's read returns (an empty file) and
  // it ends at once, touching nothing of the loader that is gone (ASan saw it decode the
  // next substitute into freed memory before the WorkerGuard).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (threads() > before - 2 && Clock::now() < deadline) {
    for (const auto& e : fs::directory_iterator(data.path())) {
      if (!e.is_fifo()) continue;
      const int fd = ::open(e.path().c_str(), O_WRONLY | O_NONBLOCK);  // fails unless a reader waits
      if (fd >= 0) ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the condition above
  }
  CHECK(threads() <= before - 2);
}
