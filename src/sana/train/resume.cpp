#include "sana/train/resume.h"

#include <fmt/format.h>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

std::string choose_checkpoint(const config::Config& cfg, dist::Runtime& rt, const std::vector<std::string>& skip) {
  std::string chosen;
  if (rt.rank() == 0) {
    if (cfg.resume_from == "latest") {
      const auto r = ckpt::resolve_latest(cfg.work_dir, skip);
      for (const auto& w : r.warnings) log::warn_shared("resume_from latest: {}", w);
      chosen = r.path;
      if (chosen.empty()) log::info("resume_from latest: no checkpoint in {}/checkpoints; starting fresh", cfg.work_dir);
    } else {
      chosen = cfg.resume_from;
    }
  }
  return rt.broadcast_string(chosen);
}

void check_resumable(const ckpt::TrainerState& saved, const config::Config& cfg, const std::string& model_name,
                     const std::string& source) {
  const auto& t = cfg.train;
  if (saved.seed == t.seed && saved.model == model_name) return;
  throw UsageError(
      fmt::format("resume_from {}: the checkpoint was trained with train.seed {} and {}; this run has {} and {}. Keep "
                  "them to continue the same sample stream (the number of processes and train.global_batch_size "
                  "may change)",
                  source, saved.seed, saved.model, t.seed, model_name),
      "config error");
}

std::optional<ckpt::Snapshot> read_resume_checkpoint(const config::Config& cfg, dist::Runtime& rt,
                                                      const std::string& model_name, std::string& source,
                                                      const std::vector<std::string>& skip) {
  if (cfg.resume_from.empty()) return std::nullopt;
  source = choose_checkpoint(cfg, rt, skip);
  if (source.empty()) return std::nullopt;
  auto snap = ckpt::read_checkpoint(source, /*tensors=*/false);  // format 3: the Checkpointer reads its share
  check_resumable(snap.state, cfg, model_name, source);
  return snap;
}

}  // namespace sana::train
