// Control maps for ControlNet runs, as the loader makes them: OpenCV's canny of each bucket
// image, the dataset's own control images, upstream's HED scribbles and soft edges (the HED
// network's edges checked against upstream's HEDdetector in python3-torch): mirrored with
// the sample's flip, the same at any process count.
#include "catch.h"
#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <opencv2/imgproc.hpp>
#include <set>

#include "loader_fixture.h"
#include "sana/data/check_data.h"
#include "sana/model/encoders.h"
#include "sana/train/options/core_options.h"
#include "sana/train/input/run_encoders.h"
#include "sana/util/safetensors.h"
#include "test_support.h"

using namespace sana::test;

// ControlNet runs: each batch carries its images' control maps, made from the bucket image
// the loader decoded (OpenCV's Canny on it, mirrored with the sample's flip).
TEST_CASE("control maps are OpenCV's canny of each bucket image, the same on any process count", "[loader][control]") {
  Fixture fx;
  const auto plan = fx.dataset->plan(1);
  auto with_control = [&](int workers, int rank, int world, int64_t micro) {
    auto o = fx.options(workers, rank, world, micro);
    o.control.kind = ControlKind::canny;
    o.control.canny_low = 100;
    o.control.canny_high = 200;
    return o;
  };
  Loader whole(*fx.dataset, plan, with_control(2, 0, 1, 4));
  Loader r0(*fx.dataset, plan, with_control(1, 0, 2, 1));
  Loader r1(*fx.dataset, plan, with_control(2, 1, 2, 1));
  std::map<SampleId, torch::Tensor> on_one, on_two;
  int flipped = 0, edges = 0;
  for (auto& b : drain(whole)) {
    REQUIRE(b.control.defined());
    REQUIRE(b.control.sizes() == b.images.sizes());
    const auto& bucket = fx.dataset->buckets().bucket(b.bucket);
    for (size_t i = 0; i < b.decoded_ids.size(); ++i) {
      const SampleId id = b.decoded_ids[i];
      on_one[id] = b.control[static_cast<int64_t>(i)];
      // The bucket image as training sees it, through OpenCV directly.
      DecodeOptions decode;
      decode.filter = filter_for_table(fx.dataset->buckets().table_of(b.bucket).name());
      const auto d =
          decode_to_bucket(std::string(fx.dataset->index().text(id).path), bucket.height, bucket.width, false, decode);
      REQUIRE(d.ok());
      cv::Mat canny;
      cv::Canny(d.rgb, canny, 100, 200);
      auto expected = torch::from_blob(canny.data, {canny.rows, canny.cols}, torch::kUInt8).to(torch::kFloat32) / 127.5 - 1;
      // The image's flip, read from the image itself: its map is mirrored with it.
      std::vector<float> pixels(static_cast<size_t>(3 * bucket.height * bucket.width));
      to_chw_normalized(d.rgb, pixels.data());
      const auto plain = torch::from_blob(pixels.data(), b.images[static_cast<int64_t>(i)].sizes(), torch::kFloat32);
      if (!torch::equal(plain, b.images[static_cast<int64_t>(i)])) {
        REQUIRE(torch::equal(plain.flip({2}), b.images[static_cast<int64_t>(i)]));
        expected = expected.flip({1});
        ++flipped;
      }
      for (int64_t c = 0; c < 3; ++c) CHECK(torch::equal(b.control[static_cast<int64_t>(i)][c], expected));
      edges += cv::countNonZero(canny) > 0 ? 1 : 0;
    }
  }
  for (auto* loader : {&r0, &r1}) {
    for (auto& b : drain(*loader)) {
      for (size_t i = 0; i < b.decoded_ids.size(); ++i) on_two[b.decoded_ids[i]] = b.control[static_cast<int64_t>(i)];
    }
  }
  CHECK(flipped > 0);  // the flips were exercised
  CHECK(edges > 4);    // and the photos have edges
  REQUIRE(on_one.size() == on_two.size());
  for (const auto& [id, map] : on_one) {
    INFO("sample " << id);
    CHECK(torch::equal(map, on_two.at(id)));
  }
}

// control_signal_type: dataset: each sample's control image is the file its JSONL `control`
// field names, resized and cropped to the image's bucket and flipped with it; a sample
// without one is a bad sample, replaced as any other.
TEST_CASE("the dataset's control images come with their samples, at their bucket, flipped with them",
          "[loader][control]") {
  namespace fs = std::filesystem;
  TempDir dir;
  const fs::path mate("/usr/share/backgrounds/mate/nature");
  const std::vector<std::string> photos = {"Aqua.jpg", "FreshFlower.jpg", "Garden.jpg", "GreenMeadow.jpg",
                                           "LadyBird.jpg", "Wood.jpg", "YellowFlower.jpg", "Storm.jpg"};
  std::string jsonl;
  for (size_t i = 0; i < photos.size(); ++i) {
    // Each photo's "control" is the next photo: told apart from the image itself.
    const std::string control = i + 1 < photos.size() ? (mate / photos[(i + 1) % photos.size()]).string() : "";
    jsonl += fmt::format("{{\"path\": \"{}\", \"caption\": \"c{}\"{}}}\n", (mate / photos[i]).string(), i,
                         control.empty() ? "" : fmt::format(", \"control\": \"{}\"", control));
  }
  const auto dataset = Dataset::open(small_buckets(dir.write("meta.jsonl", jsonl), dir.path("index"), 2));
  const auto plan = dataset.plan(0);
  auto o = loader_options(2);
  o.control.kind = ControlKind::dataset;
  Loader loader(dataset, plan, o);
  int flipped = 0, checked = 0;
  while (auto b = loader.next()) {
    const auto& bucket = dataset.buckets().bucket(b->bucket);
    DecodeOptions decode;
    decode.filter = filter_for_table(dataset.buckets().table_of(b->bucket).name());
    for (size_t i = 0; i < b->decoded_ids.size(); ++i) {
      const auto row = static_cast<int64_t>(i);
      const SampleId id = b->decoded_ids[i];
      const std::string control = control_image(dataset.index().text(id).meta);
      REQUIRE_FALSE(control.empty());  // the one without is never trained
      const auto image = decode_to_bucket(std::string(dataset.index().text(id).path), bucket.height, bucket.width,
                                          false, decode);
      const auto map = decode_to_bucket(control, bucket.height, bucket.width, false, decode);
      REQUIRE((image.ok() && map.ok()));
      std::vector<float> a(static_cast<size_t>(3 * bucket.height * bucket.width)), c(a.size());
      to_chw_normalized(image.rgb, a.data());
      to_chw_normalized(map.rgb, c.data());
      auto want_image = torch::from_blob(a.data(), b->images[row].sizes(), torch::kFloat32);
      auto want_control = torch::from_blob(c.data(), b->images[row].sizes(), torch::kFloat32);
      if (!torch::equal(want_image, b->images[row])) {  // flipped: the control with it
        want_image = want_image.flip({2});
        want_control = want_control.flip({2});
        ++flipped;
      }
      CHECK(torch::equal(want_image, b->images[row]));
      CHECK(torch::equal(want_control, b->control[row]));
      ++checked;
    }
  }
  CHECK(checked >= static_cast<int>(photos.size()) - 1);
  CHECK(flipped > 0);
  CHECK(loader.bad_counts().by_reason.count("no control image") == 1);
  // check-data reads them too: the sample without one is counted bad.
  CheckDataOptions check;
  check.dataset = small_buckets(dir.path("meta.jsonl"), dir.path("index"), 2);
  check.loader = loader_options(2);
  check.loader.control.kind = ControlKind::dataset;
  const auto checked_data = check_data(check);
  CHECK(checked_data.bad_by_reason.count("no control image") == 1);
  CHECK(checked_data.substituted == 1);
}

namespace {

// A ControlNet config on HED maps with the tiny stand-in network (make_torchscript_encoders.py).
sana::config::Config hed_config(sana::config::ControlSignal signal) {
  sana::config::Config cfg;
  cfg.model.model = "SanaMSControlNet_tiny_P2_D4";
  cfg.controlnet.control_signal_type = signal;
  cfg.controlnet.hed_model = reference_fixtures("make_torchscript_encoders.py").path("hed.pt");
  cfg.controlnet.detect_resolution = 64;
  return cfg;
}

}  // namespace

TEST_CASE("HED edges are upstream's HEDdetector's, in python3-torch", "[control][reference]") {
  const auto cfg = hed_config(sana::config::ControlSignal::hed);
  const auto hed = sana::model::FrozenHed::load(cfg.controlnet.hed_model);
  const auto d = decode_to_bucket("/usr/share/backgrounds/mate/nature/LadyBird.jpg", 64, 96, false, DecodeOptions{});
  REQUIRE(d.ok());
  const auto rgb = torch::from_blob(d.rgb.data, {64, 96, 3}, torch::kUInt8).clone();
  const auto edges = hed->edges(rgb);
  REQUIRE(edges.sizes() == torch::IntArrayRef({64, 96}));
  TempDir dir;
  const auto file = dir.path("hed.safetensors");
  sana::write_safetensors(file, {{"rgb", rgb}, {"edges", edges}});
  const auto r = run_command(fmt::format(SANA_PYTHON " {}/tests/reference/hed_reference.py {} {}", SANA_SOURCE_DIR,
                                         file, cfg.controlnet.hed_model));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  WARN(r.output);
}

// Upstream's scribble of an edge map is black and white at the detection size, and its ink
// grows with the thickness: 0 thins the lines (a 4x4 erosion), 24 widens them (12 px).
TEST_CASE("scribbles are black and white and as thick as asked", "[control]") {
  const auto cfg = hed_config(sana::config::ControlSignal::scribble);
  const auto hed = sana::model::FrozenHed::load(cfg.controlnet.hed_model);
  const auto d = decode_to_bucket("/usr/share/backgrounds/mate/nature/LadyBird.jpg", 128, 192, false, DecodeOptions{});
  REQUIRE(d.ok());
  const auto edges = hed->edges(torch::from_blob(d.rgb.data, {128, 192, 3}, torch::kUInt8).clone());
  const cv::Mat soft(128, 192, CV_8U, edges.data_ptr());
  std::vector<int> ink;
  for (const int thickness : {0, 2, 24}) {
    const cv::Mat map = scribble_of_edges(soft, thickness);
    cv::Mat other = (map != 0) & (map != 255);
    CHECK(cv::countNonZero(other) == 0);
    ink.push_back(cv::countNonZero(map));
  }
  INFO("ink at thickness 0, 2, 24: " << ink[0] << ", " << ink[1] << ", " << ink[2]);
  CHECK(ink[1] > 0);
  CHECK(ink[0] < ink[1]);
  CHECK(ink[1] < ink[2]);
}

// Scribbles: upstream's get_scribble_map of the HED edges (black and white), with a
// thickness drawn per sample and epoch; soft HED edges keep their grey levels. Both the same
// on one process and on two.
TEST_CASE("HED scribbles and edges: black and white or soft, the same on any process count, thickness per epoch",
          "[loader][control]") {
  Fixture fx;
  sana::train::Encoders encoders;
  encoders.hed = sana::model::FrozenHed::load(hed_config(sana::config::ControlSignal::scribble).controlnet.hed_model);
  for (const auto signal : {sana::config::ControlSignal::scribble, sana::config::ControlSignal::hed}) {
    const auto control = sana::train::control_maps_for(sana::train::control_map_options_for(hed_config(signal)), encoders);
    auto maps_of = [&](int64_t epoch, int workers, int rank, int world, int64_t micro) {
      auto o = fx.options(workers, rank, world, micro);
      o.control = control;
      const auto plan = fx.dataset->plan(epoch);
      Loader loader(*fx.dataset, plan, o);
      std::map<SampleId, torch::Tensor> maps;
      for (auto& b : drain(loader)) {
        for (size_t i = 0; i < b.decoded_ids.size(); ++i) maps[b.decoded_ids[i]] = b.control[static_cast<int64_t>(i)];
      }
      return maps;
    };
    auto one = maps_of(1, 2, 0, 1, 4), two = maps_of(1, 1, 0, 2, 1);
    for (const auto& [id, map] : maps_of(1, 2, 1, 2, 1)) two[id] = map;
    REQUIRE(one.size() == two.size());
    std::set<float> levels;
    for (const auto& [id, map] : one) {
      INFO("sample " << id);
      CHECK(torch::equal(map, two.at(id)));
      for (const float v : std::vector<float>(map.data_ptr<float>(), map.data_ptr<float>() + map.numel())) levels.insert(v);
    }
    if (signal == sana::config::ControlSignal::scribble) {
      int64_t ink = 0, all = 0, changed = 0;
      const auto later = maps_of(2, 2, 0, 1, 4);
      for (const auto& [id, map] : one) {
        ink += map.gt(0).sum().item<int64_t>();
        all += map.numel();
        if (later.count(id) && map.gt(0).sum().item<int64_t>() != later.at(id).gt(0).sum().item<int64_t>()) ++changed;
      }
      CHECK(ink > 0);
      CHECK(ink < all);
      CHECK(changed > 0);  // another epoch, another thickness
    } else {
      CHECK(levels.size() > 16);  // soft edges
    }
  }
}
