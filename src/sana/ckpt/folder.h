// The file operations a checkpoint folder is made with, shared by both writers (format 2:
// checkpoint.cpp, format 3: shards.cpp): synced writes, checksums, and the commit that
// renames a finished temporary folder into place and moves `latest` last.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sana/ckpt/checkpoint.h"

namespace sana::ckpt {

void fsync_path(const std::filesystem::path& p);
// xxh3-64 hex of a file's bytes; CheckpointError when it is missing.
std::string file_checksum(const std::filesystem::path& p);
void write_text_synced(const std::filesystem::path& p, const std::string& text);
// The checkpoint folders in work_dir/checkpoints, oldest first.
std::vector<std::filesystem::path> checkpoint_dirs(const std::filesystem::path& root);
// `.tmp-<name>-<pid>` folders left by a writer that was killed mid-write: removed once
// their process is gone (this process's own ones are the caller's).
void remove_stale_temporaries(const std::filesystem::path& root);
// trainer_state.json's text for `s` (its `format`) with each part's JSON.
std::string trainer_state_text(const TrainerState& s, const nlohmann::json& parts);
// Renames the finished, synced `tmp` to root/name, moves `latest` to it (atomically, last),
// then deletes all but the newest keep_last_n (0 keeps all). Returns the folder.
std::string publish_folder(const std::filesystem::path& root, const std::filesystem::path& tmp, const std::string& name,
                           int64_t keep_last_n, const StageHook& before_stage = {});
// Calls `before_stage` (if set) with the stage about to begin.
inline void stage(const StageHook& before_stage, const char* name) {
  if (before_stage) before_stage(name);
}

}  // namespace sana::ckpt
