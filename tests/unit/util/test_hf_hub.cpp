// Model folders by hub name: huggingface_hub's cache layout (refs/main picks the snapshot),
// $HF_HUB_CACHE before $HF_HOME, $SANA_MODELS_DIR before both, and a message that names
// every place looked in and the download command when the model is nowhere.
#include "catch.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "sana/util/hf_hub.h"
#include "test_support.h"

using sana::test::EnvVar;

namespace {

// A repository in the cache as huggingface_hub writes it: two snapshots, refs/main naming one.
void cache_repo(const sana::test::TempDir& dir, const std::string& root, const std::string& repo) {
  dir.write(root + "/" + repo + "/snapshots/0ld/config.json", "{}");
  dir.write(root + "/" + repo + "/snapshots/c0ffee/config.json", "{}");
  dir.write(root + "/" + repo + "/refs/main", "c0ffee");
}

}  // namespace

TEST_CASE("hub names are found in the Hugging Face cache and under SANA_MODELS_DIR", "[hub]") {
  sana::test::TempDir dir;
  cache_repo(dir, "hf/hub", "models--google--gemma-2-2b-it");
  cache_repo(dir, "cache", "models--mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers");
  EnvVar home("HF_HOME", dir.path("hf").c_str());
  EnvVar models("SANA_MODELS_DIR", nullptr);
  {
    EnvVar cache("HF_HUB_CACHE", nullptr);
    const auto found = sana::hub::find_model("google/gemma-2-2b-it");
    CHECK(found.folder == dir.path("hf/hub/models--google--gemma-2-2b-it/snapshots/c0ffee"));
    // Not in this cache: every place is named, and the command that fetches it.
    const auto missing = sana::hub::find_model("mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers");
    CHECK(missing.folder.empty());
    const auto text = sana::hub::not_found_text("mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers", missing);
    CHECK_THAT(text, Catch::Matchers::Contains(dir.path("hf/hub/models--mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers")));
    CHECK_THAT(text, Catch::Matchers::Contains("SANA_MODELS_DIR"));
    CHECK_THAT(text, Catch::Matchers::Contains("huggingface-cli download mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers"));
  }
  {
    EnvVar cache("HF_HUB_CACHE", dir.path("cache").c_str());  // before HF_HOME, as huggingface_hub
    CHECK(sana::hub::find_model("mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers").folder ==
          dir.path("cache/models--mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers/snapshots/c0ffee"));
    CHECK(sana::hub::find_model("google/gemma-2-2b-it").folder.empty());
  }
  {
    // No refs/main: the snapshot there is.
    dir.write("lone/models--a--b/snapshots/only/config.json", "{}");
    EnvVar cache("HF_HUB_CACHE", dir.path("lone").c_str());
    CHECK(sana::hub::find_model("a/b").folder == dir.path("lone/models--a--b/snapshots/only"));
  }
  {
    // SANA_MODELS_DIR first, as ORG/NAME or NAME.
    dir.write("models/gemma-2-2b-it/config.json", "{}");
    EnvVar set("SANA_MODELS_DIR", dir.path("models").c_str());
    CHECK(sana::hub::find_model("google/gemma-2-2b-it").folder == dir.path("models/gemma-2-2b-it"));
  }
  // A local folder is itself; a path that is neither says so.
  CHECK(sana::hub::find_model(dir.path("models")).folder == dir.path("models"));
  CHECK(sana::hub::find_model("./nowhere/at/all").folder.empty());
  CHECK_FALSE(sana::hub::is_hub_name("./x"));
  CHECK_FALSE(sana::hub::is_hub_name("a/b/c"));
  CHECK(sana::hub::is_hub_name("google/gemma-2-2b-it"));
}
