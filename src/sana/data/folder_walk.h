// Walking a data folder (data.data_dir's folders, the index's change key): every regular file
// under it, following each symbolic link to a folder as a folder of its own. A link that
// leads back into a folder on its own path (img/loop -> ..) is a loop: IndexError (exit 2)
// naming the link and where it leads, before anything is indexed. A folder reached a second
// time by another way (two links to one folder) is walked once: its files count once. No
// torch.
#pragma once

#include <filesystem>
#include <vector>

namespace sana::data {

// The regular files under `dir` (links to files included, as the paths they are found at),
// sorted, so the same tree gives the same list whatever the file system's order. `dir` not
// a folder: no files. Throws IndexError for a loop, or a folder that cannot be read.
std::vector<std::filesystem::path> files_under(const std::filesystem::path& dir);

}  // namespace sana::data
