#include "sana/data/folder_walk.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "sana/data/dataset_index.h"

namespace fs = std::filesystem;

namespace sana::data {

namespace {

// A folder as the file system knows it, whichever path or link reaches it.
using FolderId = std::pair<dev_t, ino_t>;

bool folder_id(const fs::path& p, FolderId& id) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

struct Walk {
  struct Step {
    FolderId id;
    fs::path name;  // as reached
    bool link;      // reached through a symbolic link
  };
  std::vector<fs::path> files;
  std::set<FolderId> walked;  // every folder walked so far
  std::vector<Step> path;     // the folders from the root down to the current one

  void folder(const fs::path& dir, const FolderId& id, bool link) {
    walked.insert(id);
    path.push_back({id, dir, link});
    std::error_code ec;
    fs::directory_iterator it(dir, ec), end;
    if (ec) throw IndexError(fmt::format("data folder '{}' cannot be read: {}", dir.string(), ec.message()));
    std::vector<fs::directory_entry> entries;
    for (; it != end; it.increment(ec)) {
      if (ec) break;
      entries.push_back(*it);
    }
    if (ec) throw IndexError(fmt::format("data folder '{}' cannot be read: {}", dir.string(), ec.message()));
    std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.path() < b.path(); });
    for (const auto& e : entries) entry(e.path());
    path.pop_back();
  }

  // `p` leads into path[at]: the link that closes the loop is `p` itself, or else the last
  // link followed below path[at] (img/loop -> .. is found at img/loop/img).
  [[noreturn]] void loop(const fs::path& p, bool is_link, size_t at) const {
    fs::path link = p;
    if (!is_link) {
      for (size_t k = path.size(); k-- > at + 1;) {
        if (path[k].link) {
          link = path[k].name;
          break;
        }
      }
    }
    std::error_code ec;
    const auto target = fs::read_symlink(link, ec);
    throw IndexError(fmt::format(
        "data folder: '{}' is a symbolic link{} that leads back into '{}', a folder it is in, so walking it would "
        "never end. Remove the link, or point it at a folder outside '{}'",
        link.string(), ec ? "" : fmt::format(" to '{}'", target.string()), path[at].name.string(),
        path.front().name.string()));
  }

  void entry(const fs::path& p) {
    std::error_code ec;
    const auto link = fs::symlink_status(p, ec);
    const bool is_link = !ec && fs::is_symlink(link);
    FolderId id;
    if (!folder_id(p, id)) {  // a file, a link to one, or a link that leads nowhere
      if (fs::is_regular_file(p, ec)) files.push_back(p);
      return;
    }
    for (size_t at = 0; at < path.size(); ++at) {
      if (path[at].id == id) loop(p, is_link, at);
    }
    if (walked.count(id) > 0) return;  // reached before by another way: its files are listed once
    folder(p, id, is_link);
  }
};

}  // namespace

std::vector<fs::path> files_under(const fs::path& dir) {
  Walk walk;
  FolderId id;
  if (!folder_id(dir, id)) return {};
  walk.folder(dir, id, false);
  std::sort(walk.files.begin(), walk.files.end());
  return walk.files;
}

}  // namespace sana::data
