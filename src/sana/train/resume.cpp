#include "sana/train/resume.h"

#include <fmt/format.h>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

std::string choose_checkpoint(const config::Config& cfg, dist::Runtime& rt) {
  std::string chosen;
  if (rt.rank() == 0) {
    if (cfg.resume_from == "latest") {
      const auto r = ckpt::resolve_latest(cfg.work_dir);
      for (const auto& w : r.warnings) log::warn("resume_from latest: {}", w);
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
  if (saved.global_batch_size == t.global_batch_size && saved.seed == t.seed && saved.model == model_name) return;
  // Upstream's batch style makes the global batch follow the world size: say how to pin it.
  const std::string pin =
      config::upstream_batch_style(t) && saved.global_batch_size != t.global_batch_size
          ? fmt::format("; with train.train_batch_size the global batch follows the world size: set "
                        "train.global_batch_size: {} and train.micro_batch_size instead to resume on this one",
                        saved.global_batch_size)
          : "";
  throw UsageError(
      fmt::format("resume_from {}: the checkpoint was trained with train.global_batch_size {}, train.seed {} and {}; "
                  "this run has {}, {} and {}. Keep them to continue the same sample stream (any world size that "
                  "divides the global batch works){}",
                  source, saved.global_batch_size, saved.seed, saved.model, t.global_batch_size, t.seed, model_name,
                  pin),
      "config error");
}

std::optional<ckpt::Snapshot> read_resume_checkpoint(const config::Config& cfg, dist::Runtime& rt,
                                                      const std::string& model_name, std::string& source) {
  if (cfg.resume_from.empty()) return std::nullopt;
  source = choose_checkpoint(cfg, rt);
  if (source.empty()) return std::nullopt;
  auto snap = ckpt::read_checkpoint(source);
  check_resumable(snap.state, cfg, model_name, source);
  return snap;
}

}  // namespace sana::train
