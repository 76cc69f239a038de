// Checkpoint format 3 (docs/checkpoints.md, "Format 3"): a checkpoint every rank writes at
// once. Each rank writes the entries it owns of each part with tensors to a file of its
// own, <part>-<rank+1>-of-<W>.safetensors, and says what it wrote (RankShards: every
// entry's file, byte range and xxh3-64 checksum); rank 0 merges every rank's into
// index.json and commits the folder as write_checkpoint does (fsync, rename, `latest`
// last). A reader takes any entry by name with one ranged read, checked by its checksum,
// so a rank reads only what it keeps. Who owns what is the caller's (train/): this module
// writes and reads whatever it is given.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sana/ckpt/checkpoint.h"

namespace sana::ckpt {

struct ShardEntry {
  std::string name;
  std::string dtype;  // safetensors' name: F32, BF16, ...
  std::vector<int64_t> shape;
  std::string file;
  int64_t offset = 0;  // of its bytes in the file
  int64_t bytes = 0;
  std::string xxh3;    // of its bytes
  // Its place in the part's whole list: `order` (the caller's, e.g. the parameter's
  // registration index), then the writing rank, then its place in that rank's file.
  int64_t order = 0;
  int rank = 0;
  int64_t minor = 0;
};

// What one rank wrote, or why it could not.
struct RankShards {
  int rank = 0;
  std::string error;                     // not empty: the write failed (nothing else holds)
  std::map<std::string, int64_t> files;  // file name -> bytes
  std::map<std::string, std::vector<ShardEntry>> parts;  // part -> its entries in this rank's files
  nlohmann::json to_json() const;
  static RankShards from_json(const nlohmann::json& j);
};

// model-00002-of-00004.safetensors: rank 1 of 4's file of the `model` part.
std::string shard_file_name(const std::string& part, int rank, int world);

// The temporary folder a format-3 checkpoint is written into before its rename:
// work_dir/checkpoints/.tmp-step_NNNNNNNN-<token> (token: the committing process's pid, the
// same on every rank, so a folder left by a killed run is recognised and removed).
std::string shard_temporary_folder(const std::string& work_dir, int64_t global_step, const std::string& token);

// Writes this rank's entries into `dir` (made if missing): for each part of `mine` with
// tensors one file, fsynced (an empty list writes a file without tensors). `order_of(part,
// entry)` gives each entry's `order`. Throws CheckpointError (disk full...).
RankShards write_rank_shards(const std::string& dir, const std::vector<std::pair<std::string, PartState>>& mine,
                             int rank, int world,
                             const std::function<int64_t(const std::string&, const std::string&)>& order_of,
                             const StageHook& before_stage = {});

// Rank 0, once every rank's write is over: `ranks` (one per rank) merged into index.json,
// trainer_state.json written (`state` as format 3, each part's JSON from `part_json`), and
// `dir` committed as write_checkpoint does; all but the newest keep_last_n are then
// deleted. Throws CheckpointError naming a rank whose write failed, or whose file rank 0
// does not find whole in `dir` (a work_dir not shared by every rank), after removing `dir`.
std::string commit_shards(const std::string& work_dir, const std::string& dir, TrainerState state,
                          const nlohmann::json& part_json, const std::vector<RankShards>& ranks, int64_t keep_last_n,
                          const StageHook& before_stage = {});

// A format-3 checkpoint's index.json.
struct ShardIndex {
  int world = 0;                                         // the writers
  std::map<std::string, int64_t> files;                  // file name -> bytes
  std::map<std::string, std::vector<ShardEntry>> parts;  // part -> every entry, in the part's order
};

// index.json of a verified checkpoint folder (its checksum is checked again here).
ShardIndex read_shard_index(const std::string& dir);

// The entries' tensors (CPU), one ranged read each, each checked against its checksum
// (CheckpointError naming the file and tensor otherwise). `bytes_read` (if given) grows by
// the bytes read.
NamedTensors read_shard_entries(const std::string& dir, const std::vector<const ShardEntry*>& entries,
                                int64_t* bytes_read = nullptr);

// Writes `part` whole as one safetensors file (format 2's <part>.safetensors, which other
// tools read): the header from the index, the metadata of the part's first shard file,
// then each entry's bytes copied through a buffer of at most `buffer_bytes` and checked
// against its checksum on the way. Memory stays at the buffer whatever the tensors' size.
// Returns the bytes written; the file is fsynced.
int64_t consolidate_part(const std::string& dir, const ShardIndex& index, const std::string& part,
                         const std::string& out_path, int64_t buffer_bytes = int64_t{64} << 20);

// A format-3 checkpoint `dir` rewritten as format 2 in `out_dir` (made if missing): each
// part consolidated into one file, trainer_state.json with their checksums. Tools that
// read the part files take it, and a run resumes from it as from `dir`. Returns the files.
std::vector<std::string> consolidate_checkpoint(const std::string& dir, const std::string& out_dir);

}  // namespace sana::ckpt
