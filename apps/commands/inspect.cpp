// `sana-train inspect CHECKPOINT|WORK_DIR`: what a checkpoint holds (the run's position,
// then each stateful part's tensors and JSON), every checksum verified; a damaged one is a
// CheckpointError (exit 1).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "command.h"
#include "sana/ckpt/checkpoint.h"

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
        dir, s.model, s.epoch + 1, s.step_in_epoch, s.global_step, s.consumed_samples, s.global_batch_size, s.seed,
        s.world_size, s.world_size == 1 ? "" : "es", s.config_hash);
    for (const auto& [name, part] : snap.parts) std::cout << part_line(name, part) << "\n";
    std::cout << fmt::format("checksums: all {} files verified\n", s.checksums.size());
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

 private:
  std::string path_;
};

}  // namespace

std::unique_ptr<PlainCommand> inspect_command(CLI::App& app) { return std::make_unique<Inspect>(app); }

}  // namespace sana::app
