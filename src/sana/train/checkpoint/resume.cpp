#include "sana/train/checkpoint/resume.h"

#include <fmt/format.h>

#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

std::string choose_checkpoint(const ResumeOptions& o, dist::Runtime& rt, const std::vector<std::string>& skip) {
  std::string chosen;
  if (rt.rank() == 0) {
    if (o.resume_from == "latest") {
      const auto r = ckpt::resolve_latest(o.work_dir, skip);
      for (const auto& w : r.warnings) log::warn_shared("resume_from latest: {}", w);
      chosen = r.path;
      if (chosen.empty()) log::info("resume_from latest: no checkpoint in {}/checkpoints; starting fresh", o.work_dir);
    } else {
      chosen = o.resume_from;
    }
  }
  return rt.broadcast_string(chosen);
}

void check_resumable(const ckpt::TrainerState& saved, const ResumeOptions& o, const std::string& source) {
  if (saved.seed == o.seed && saved.model == o.model) return;
  throw UsageError(
      fmt::format("resume_from {}: the checkpoint was trained with train.seed {} and {}; this run has {} and {}. Keep "
                  "them to continue the same sample stream (the number of processes and train.global_batch_size "
                  "may change)",
                  source, saved.seed, saved.model, o.seed, o.model),
      "config error");
}

std::optional<ckpt::Snapshot> read_resume_checkpoint(const ResumeOptions& o, dist::Runtime& rt, std::string& source,
                                                      const std::vector<std::string>& skip) {
  if (o.resume_from.empty()) return std::nullopt;
  source = choose_checkpoint(o, rt, skip);
  if (source.empty()) return std::nullopt;
  auto snap = ckpt::read_checkpoint(source, /*tensors=*/false);  // format 3: the Checkpointer reads its share
  check_resumable(snap.state, o, source);
  return snap;
}

}  // namespace sana::train
