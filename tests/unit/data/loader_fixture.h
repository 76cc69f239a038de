// The loader tests' fixtures: small generated buckets over real photos (and bad files), the
// loader's options, and a whole epoch's batches.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "sana/data/loader.h"
#include "test_support.h"

namespace sana::test {

using namespace sana::data;

// 32-px generated buckets in steps of 8, padded tails, seed 5.
inline DatasetOptions small_buckets(const std::string& source, const std::string& index_dir, int64_t global_batch) {
  DatasetOptions d;
  d.sources = {source};
  d.index_dir = index_dir;
  d.buckets.base_sizes = {32};
  d.buckets.aspect_ratio_type = "generated";
  d.buckets.bucket_step = 8;
  d.tail = TailPolicy::pad;
  d.batch.global_batch = global_batch;
  d.seed = 5;
  return d;
}

// Random flips, seed 5, a small queue.
inline LoaderOptions loader_options(int workers, int rank = 0, int world = 1, int64_t micro = 2) {
  LoaderOptions o;
  o.rank = rank;
  o.world_size = world;
  o.micro_batch = micro;
  o.workers = workers;
  o.prefetch = 3;
  o.random_flip = true;
  o.seed = 5;
  o.wait_timeout_s = 60;
  return o;
}

struct Fixture {
  TempDir dir;
  DatasetOptions dataset_options;
  std::unique_ptr<Dataset> dataset;

  Fixture() {
    namespace fs = std::filesystem;
    const fs::path images = dir.path("images");
    fs::create_directories(images);
    for (const char* f : {"nature/Aqua.jpg", "nature/FreshFlower.jpg", "nature/Garden.jpg",
                          "nature/GreenMeadow.jpg", "nature/LadyBird.jpg", "nature/Wood.jpg",
                          "nature/YellowFlower.jpg", "nature/Storm.jpg", "abstract/Spring.png",
                          "desktop/GreenTraditional.jpg"}) {
      fs::copy_file(fs::path("/usr/share/backgrounds/mate") / f, images / fs::path(f).filename());
    }
    dir.write("images/zero.jpg", "");
    dir.write("images/words.png", "this is text, not a PNG");
    const std::string aqua = dir.path("images/Aqua.jpg");
    std::ifstream in(aqua, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    dir.write("images/cut.jpg", bytes.substr(0, bytes.size() / 3));
    dataset_options = small_buckets(images.string(), dir.path("work/index"), 4);
    dataset = std::make_unique<Dataset>(Dataset::open(dataset_options));
  }

  LoaderOptions options(int workers, int rank = 0, int world = 1, int64_t micro = 2) const {
    return loader_options(workers, rank, world, micro);
  }
};

inline std::vector<Batch> drain(Loader& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

}  // namespace sana::test
