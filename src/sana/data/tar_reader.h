// The members of an uncompressed tar archive (a WebDataset shard), listed without reading
// their contents: ustar and GNU headers, GNU long names and pax `path` records (what
// Python's tarfile and GNU tar write). No torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace sana::data {

struct TarMember {
  std::string name;
  uint64_t offset = 0;  // of the member's bytes in the archive
  uint64_t size = 0;
};

// Calls `visit` for every regular file, in archive order. Throws IndexError naming the
// archive and the byte offset when a header is damaged or the archive is truncated or
// compressed (shards must be plain .tar).
void scan_tar(const std::string& path, const std::function<void(const TarMember&)>& visit);

// The same over an archive already in memory (`name` names it in errors).
void scan_tar_bytes(const char* data, size_t size, const std::string& name,
                    const std::function<void(const TarMember&)>& visit);

}  // namespace sana::data
