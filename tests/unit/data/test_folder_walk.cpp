// Walking a data folder (data/folder_walk.h): every file once, sorted, links to folders
// followed, a folder reached twice walked once, a dangling link passed over, and a link back
// into a folder on its own path an IndexError naming the link and where it leads.
#include "catch.h"

#include <filesystem>
#include <string>
#include <vector>

#include "sana/data/dataset_index.h"
#include "sana/data/folder_walk.h"
#include "test_support.h"

namespace fs = std::filesystem;
using sana::data::files_under;

namespace {

std::vector<std::string> relative(const std::vector<fs::path>& files, const std::string& root) {
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back(fs::path(f).lexically_relative(root).string());
  return out;
}

}  // namespace

TEST_CASE("files_under: links to folders followed, each folder once, sorted", "[data][index]") {
  sana::test::TempDir d;
  d.write("img/b.png", "b");
  d.write("img/a.png", "a");
  d.write("img/sub/c.png", "c");
  d.write("outside/d.png", "d");
  fs::create_directory_symlink("../outside", d.path("img/one"));
  fs::create_directory_symlink("../../outside", d.path("img/sub/two"));  // the same folder again
  fs::create_symlink("../outside/d.png", d.path("img/e.png"));         // a link to a file: a file
  fs::create_symlink("../nowhere", d.path("img/dangling"));
  const auto files = relative(files_under(d.path("img")), d.path("img"));
  CHECK(files == std::vector<std::string>{"a.png", "b.png", "e.png", "one/d.png", "sub/c.png"});
  CHECK(files_under(d.path("img/a.png")).empty());  // not a folder
  CHECK(files_under(d.path("missing")).empty());
}

TEST_CASE("files_under: a link back into a folder on its own path is an error naming it", "[data][index]") {
  sana::test::TempDir d;
  d.write("img/a.png", "a");
  d.write("img/sub/b.png", "b");
  fs::create_directory_symlink("..", d.path("img/sub/loop"));
  CHECK_THROWS_AS(files_under(d.path("img")), sana::data::IndexError);
  CHECK_THROWS_WITH(files_under(d.path("img")),
                    Catch::Contains("'" + d.path("img/sub/loop") + "' is a symbolic link to '..' that leads back "
                                    "into '" + d.path("img") + "'"));
  // A link to the folder itself.
  sana::test::TempDir e;
  e.write("img/a.png", "a");
  fs::create_directory_symlink(".", e.path("img/self"));
  CHECK_THROWS_WITH(files_under(e.path("img")), Catch::Contains("img/self' is a symbolic link to '.'"));
  // A link to a folder above the root: the loop closes one folder further down, and the
  // message names the link, not the real folder it was found at.
  sana::test::TempDir f;
  f.write("img/a.png", "a");
  fs::create_directory_symlink("..", f.path("img/up"));
  CHECK_THROWS_WITH(files_under(f.path("img")),
                    Catch::Contains("'" + f.path("img/up") + "' is a symbolic link to '..' that leads back into '" +
                                    f.path("img") + "'"));
}
