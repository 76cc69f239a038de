// Where a sample's bytes are: a path in a dataset index names a plain file, or a member of
// an uncompressed tar shard (WebDataset / upstream Sana's wids layout) written as
//   <shard>.tar#<member name>@<offset>+<size>
// with the offset and size of the member's bytes inside the shard, found once at indexing,
// so reading a member is one seek and one read. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sana::data {

struct FileRef {
  std::string file;    // the plain file, or the shard
  std::string member;  // the member's name inside the shard ("" for a plain file)
  uint64_t offset = 0, size = 0;
  bool in_tar() const { return !member.empty(); }
};

// A plain path parses to itself; only the exact member form above is a member.
FileRef parse_file_ref(const std::string& path);
std::string member_ref(const std::string& shard, const std::string& member, uint64_t offset, uint64_t size);

// The name whose extension tells the format: the member's name, else the path.
std::string format_name(const std::string& path);

// Reads the whole file or member into `out`; returns "" or why it cannot ("no such file",
// "a folder, not a file", "cannot open the file", "the shard is shorter than the member").
std::string read_ref(const std::string& path, std::vector<char>& out);
std::string read_ref(const std::string& path, std::vector<unsigned char>& out);

}  // namespace sana::data
