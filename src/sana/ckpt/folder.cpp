#include "sana/ckpt/folder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "sana/util/hash.h"

namespace fs = std::filesystem;

namespace sana::ckpt {

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw CheckpointError(fmt::format("cannot open '{}' to sync it: {}", p.string(), std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError(fmt::format("fsync of '{}' failed: {}", p.string(), std::strerror(errno)));
}

std::string file_checksum(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("'{}' is missing", p.string()));
  Hasher h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex();
}

void write_text_synced(const fs::path& p, const std::string& text) {
  {
    std::ofstream out(p, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw CheckpointError(fmt::format("cannot write '{}'", p.string()));
  }
  fsync_path(p);
}

std::vector<fs::path> checkpoint_dirs(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void remove_stale_temporaries(const fs::path& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) != 0) continue;
    const long pid = std::strtol(n.c_str() + n.rfind('-') + 1, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      fs::remove_all(e.path(), ec);
    }
  }
}

std::string publish_folder(const fs::path& root, const fs::path& tmp, const std::string& name, int64_t keep_last_n,
                           const StageHook& before_stage) {
  const fs::path final_dir = root / name;
  std::error_code ec;
  stage(before_stage, "rename");
  fs::remove_all(final_dir, ec);  // a same-step checkpoint from an earlier attempt
  fs::rename(tmp, final_dir);
  fsync_path(root);
  // `latest` moves last, atomically.
  stage(before_stage, "latest");
  write_text_synced(root / "latest.tmp", name + "\n");
  fs::rename(root / "latest.tmp", root / "latest");
  fsync_path(root);
  if (keep_last_n > 0) {
    auto dirs = checkpoint_dirs(root);
    while (static_cast<int64_t>(dirs.size()) > keep_last_n) {
      if (dirs.front() != final_dir) fs::remove_all(dirs.front(), ec);
      dirs.erase(dirs.begin());
    }
  }
  return final_dir.string();
}

}  // namespace sana::ckpt
