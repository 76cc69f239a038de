// `sana-train inspect CHECKPOINT|WORK_DIR [--consolidate DIR]`: what a checkpoint holds
// (the run's position, then each stateful part's tensors and JSON; format 3: each rank's
// files), every checksum verified; a damaged one is a CheckpointError (exit 1).
// --consolidate rewrites a format-3 checkpoint as format 2 (one file per part) in DIR.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "command.h"
#include "sana/ckpt/checkpoint.h"
#include "sana/ckpt/shards.h"
#include "sana/util/error.h"

namespace sana::app {

namespace {

namespace fs = std::filesystem;

// The checkpoint folder `path` names: itself, or for a work_dir its newest valid one.
std::string checkpoint_folder(const std::string& path) {
  if (!fs::exists(fs::path(path) / "checkpoints")) return path;
  const auto r = ckpt::resolve_latest(path);
  for (const auto& w : r.warnings) std::cerr << "warning: " << w << "\n";
  if (r.path.empty()) throw ckpt::CheckpointError(fmt::format("no valid checkpoint in {}", path));
  return r.path;
}

class Inspect : public PlainSubcommand {
 public:
  explicit Inspect(CLI::App& app)
      : PlainSubcommand(app, "inspect", "what a checkpoint holds; verifies its checksums (exit 1 if bad)") {
    cli_->add_option("checkpoint", path_, "a checkpoint folder, or a work_dir (its latest)")->required();
    cli_->add_option("--consolidate", consolidate_,
                     "write a format-3 checkpoint as format 2 (one file per part) into this folder");
  }

  int run() override {
    const std::string dir = checkpoint_folder(path_);
    const auto snap = ckpt::read_checkpoint(dir);
    const auto& s = snap.state;
    std::cout << fmt::format(
        "checkpoint {}\n"
        "model {}\n"
        "position: epoch {} step {} (global step {}, {} samples consumed)\n"
        "global batch {}, seed {}, saved on {} process{}, config {}\n",
        dir, s.model, s.position.epoch + 1, s.position.step_in_epoch, s.position.global_step,
        s.position.consumed_samples, s.global_batch_size, s.seed,
        s.world_size, s.world_size == 1 ? "" : "es", s.config_hash);
    for (const auto& [name, part] : snap.parts) std::cout << part_line(name, part) << "\n";
    if (s.format < 3) {
      if (!consolidate_.empty()) {
        throw UsageError(fmt::format("--consolidate: {} is format {}: one file per part already", dir, s.format));
      }
      std::cout << fmt::format("checksums: all {} files verified\n", s.checksums.size());
      return 0;
    }
    const auto index = ckpt::read_shard_index(dir);
    int64_t tensors = 0;
    for (const auto& [part, entries] : index.parts) tensors += static_cast<int64_t>(entries.size());
    std::cout << fmt::format("format 3: written by {} rank{} in {} files\n", index.world, index.world == 1 ? "" : "s",
                             index.files.size());
    for (int r = 0; r < index.world; ++r) std::cout << shard_line(index, r) << "\n";
    std::cout << fmt::format("checksums: index.json and all {} tensors verified\n", tensors);
    if (!consolidate_.empty()) {
      for (const auto& f : ckpt::consolidate_checkpoint(dir, consolidate_)) std::cout << "wrote " << f << "\n";
    }
    return 0;
  }

 private:
  // "model: 94 tensors, 940000 values" / "bad_samples: {"bad_samples":0,...}"
  static std::string part_line(const std::string& name, const PartState& part) {
    std::string line = name + ":";
    if (part.tensors) {
      int64_t values = 0;
      for (const auto& [n, t] : *part.tensors) values += t.numel();
      line += fmt::format(" {} tensors, {} values", part.tensors->size(), values);
    }
    if (!part.json.is_null()) line += (part.tensors ? "; " : " ") + part.json.dump();
    return line;
  }

  // "rank 1: 3 files, 123456 bytes (model 40 tensors, optimizer 120 tensors)"
  static std::string shard_line(const ckpt::ShardIndex& index, int rank) {
    int64_t files = 0, bytes = 0;
    for (const auto& [file, size] : index.files) {
      bool mine = false;
      for (const auto& [part, entries] : index.parts) mine = mine || file == ckpt::shard_file_name(part, rank, index.world);
      if (mine) {
        ++files;
        bytes += size;
      }
    }
    std::string parts;
    for (const auto& [part, entries] : index.parts) {
      const auto n = std::count_if(entries.begin(), entries.end(), [&](const auto& e) { return e.rank == rank; });
      parts += fmt::format("{}{} {} tensors", parts.empty() ? "" : ", ", part, n);
    }
    return fmt::format("  rank {}: {} files, {} bytes ({})", rank, files, bytes, parts);
  }

 private:
  std::string path_, consolidate_;
};

}  // namespace

std::unique_ptr<PlainCommand> inspect_command(CLI::App& app) { return std::make_unique<Inspect>(app); }

}  // namespace sana::app
