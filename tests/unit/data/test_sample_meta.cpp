// Upstream's per-sample metadata as data/sample_meta.h reads and uses it: the files beside a
// shard merged as SanaWebDatasetMS merges them, the filters' edge cases, and the caption
// draw where numpy would overflow. The whole path against upstream's rules, on a real wids
// dataset, is tests/apps/upstream_captions.sh.
#include "catch.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "sana/data/dataset_index.h"
#include "sana/data/sample_meta.h"
#include "test_support.h"

using namespace sana::data;
using sana::test::TempDir;
using Json = nlohmann::json;

TEST_CASE("the files beside a shard become the sample's metadata, in upstream's order", "[data]") {
  TempDir dir;
  const std::string shard = dir.path("00000.tar");
  dir.write("00000_prompt_clip_score.json", R"({"a": {"prompt": "23.5"}, "b": {"other": 1}})");
  dir.write("00000_VILA1.5.json", R"({"a": {"prompt": "vila a"}, "b": {"prompt": null}})");
  dir.write("00000_extra.json", R"({"a": {"internvl": "internvl a", "width": 7}})");
  // "zz" comes first in the file: upstream's tie-break follows the file, not the name.
  dir.write("00000_clip.json", R"({"a": {"zz_missing": 50, "internvl": 30, "_VILA1_5": 30, "prompt": 20}})");
  CaptionSources sources;
  sources.caption_suffixes = {"_VILA1.5", "_extra"};
  sources.clipscore_suffixes = {"_clip"};
  const ShardSidecars sidecars(shard, sources);

  const Json a = Json::parse(sidecars.meta_for("a", Json{{"prompt", "own a"}, {"version", "high_quality"}}));
  CHECK(a["version"] == "high_quality");
  CHECK(a["clip"] == 23.5);
  CHECK(a["scores"] == Json::parse(R"([["internvl", 30.0], ["_VILA1_5", 30.0], ["prompt", 20.0]])"));
  CHECK(a["captions"] == Json::parse(R"({"internvl": "internvl a", "_VILA1_5": "vila a"})"));
  // In the score file without a "prompt" score: null, which a CLIP threshold drops.
  const Json b = Json::parse(sidecars.meta_for("b", Json{{"prompt", "own b"}}));
  CHECK(b["clip"].is_null());
  CHECK_FALSE(b.contains("scores"));

  CaptionChoice choice;
  choice.clip_thr = 40;  // nothing passes: the best score, the first of the tie in file order
  sana::util::RandomStream rng(1);
  CHECK(choice.choose("own a", a.dump(), rng) == "internvl a");
  choice.type = CaptionSelection::proportion;
  choice.proportion = {{"_VILA1_5", 1.0}};
  CHECK(choice.choose("own a", a.dump(), rng) == "vila a");
  CHECK(choice.choose("own b", b.dump(), rng) == "own b");  // b lacks that caption: its prompt

  dir.write("broken_clip.json", "{not json");
  CaptionSources bad;
  bad.clipscore_suffixes = {"_clip"};
  CHECK_THROWS_WITH(ShardSidecars(dir.path("broken.tar"), bad), Catch::Contains("broken_clip.json"));
}

TEST_CASE("the filters keep and drop as upstream's sampler does", "[data]") {
  SampleFilter hq;
  hq.hq_only = true;
  CHECK(hq.drops(R"({"version": "high_quality"})") == nullptr);
  CHECK(std::string(hq.drops(R"({"version": "others"})")) == "data.hq_only");
  CHECK(std::string(hq.drops("")) == "data.hq_only");  // no version: upstream's "others"
  SampleFilter clip;
  clip.min_clip_score = 22;
  CHECK(clip.drops(R"({"clip": 22})") == nullptr);
  CHECK(std::string(clip.drops(R"({"clip": 21.9})")) == "data.del_img_clip_thr");
  CHECK(clip.drops(R"({"clip": 0})") == nullptr);  // upstream tests the score's truth
  CHECK(std::string(clip.drops(R"({"clip": null})")) == "data.del_img_clip_thr");
  CHECK(clip.drops("") == nullptr);  // no score file: 100
  clip.min_clip_score = 101;
  CHECK(std::string(clip.drops("")) == "data.del_img_clip_thr");
}

TEST_CASE("a low temperature draws by score^(1/t) without overflowing", "[data]") {
  // Temperature 0.01 is an exponent of 100: 1000^100 overflows a double (numpy gives inf
  // and NaN weights). Relative to the top score: (990/1000)^100 = 0.366.
  const std::string meta = R"({"scores": [["x", 1000.0], ["y", 990.0]], "captions": {"x": "X", "y": "Y"}})";
  CaptionChoice choice;
  choice.temperature = 0.001;  // read as 0.01, as upstream's max(t, 0.01)
  int x = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    sana::util::RandomStream rng(sana::util::stream_key("test", {static_cast<uint64_t>(i)}));
    const std::string c = choice.choose("P", meta, rng);
    REQUIRE((c == "X" || c == "Y"));
    x += c == "X";
  }
  const double p = 1.0 / (1.0 + std::pow(0.99, 100.0));
  CHECK(std::abs(static_cast<double>(x) / n - p) < 0.03);
}

TEST_CASE("train.eval.fraction holds out a share of the samples by their paths, training keeps the rest", "[data]") {
  SampleFilter trained, held;
  trained.holdout = held.holdout = 0.25;
  trained.holdout_seed = held.holdout_seed = 3;
  held.held_out = true;
  CHECK(trained.active());
  int out = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string path = "photos/img_" + std::to_string(i) + ".jpg";
    const bool in_training = trained.drops("", path) == nullptr;
    const bool in_eval = held.drops("", path) == nullptr;
    CHECK(in_training != in_eval);                             // each sample in exactly one set
    CHECK((trained.drops("", path) == nullptr) == in_training);  // the same draw every time
    out += in_eval ? 1 : 0;
  }
  CHECK(out > 2000 * 0.25 - 80);  // binomial(2000, 0.25): sd 19
  CHECK(out < 2000 * 0.25 + 80);
  auto other_seed = held;
  other_seed.holdout_seed = 4;
  int moved = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string path = "photos/img_" + std::to_string(i) + ".jpg";
    moved += (held.drops("", path) == nullptr) != (other_seed.drops("", path) == nullptr) ? 1 : 0;
  }
  CHECK(moved > 0);  // another train.seed, another split
}
