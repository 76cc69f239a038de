// Fault injection for the multi-process tests, in one place: every SANA_TEST_* variable
// sana-train reads, read once from the environment by main() (apps/sana_train.cpp), here and
// nowhere else (build.layout checks it). The hooks are passed in from there: to train(), the
// Trainer and what it builds, prepare-features and the launcher; no production code reads
// a global for test behaviour. Production runs leave the variables unset, and then every
// hook is off. Never includes torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sana::train {

struct TestHooks {
  // SANA_TEST_FAIL_AT=rank:step: that rank throws a data error after that global step.
  std::string fail_at;
  // SANA_TEST_LOG_IDS: each rank appends every micro-batch's sample ids to
  // work_dir/ids.rank<R>.w<W>.log ("epoch step id id ..."), for the exactly-once checks.
  bool log_ids = false;
  // SANA_TEST_DUMP_BATCHES: each rank writes every micro-batch's model input, timesteps,
  // target and loss weight to work_dir/batches/r<R>.<N>.safetensors (metadata: epoch,
  // step), for replaying the run in python3-torch (tests/reference/train_replay.py).
  bool dump_batches = false;
  // SANA_TEST_CKPT_STAGE_DELAY_MS=N: every stage of a checkpoint write takes N ms longer,
  // so a fault trial can strike while one is being written.
  int64_t ckpt_stage_delay_ms = 0;
  // SANA_TEST_INDEX_DELAY_MS=N: rank 0's indexing takes N ms longer (progress every
  // 100 ms), so a fault trial can strike while the others wait for the index.
  int64_t index_delay_ms = 0;
  // SANA_TEST_KILL_AFTER_FEATURES=rank:N: prepare-features on that rank kills itself
  // after writing N samples' files.
  std::string kill_after_features;
  // SANA_TEST_SPAWN_PAUSE_MS=local_rank:N: `sana-train launch` keeps that worker N ms
  // between fork and exec, signals held (dist::LaunchOptions::pause_before_exec).
  std::string spawn_pause;
  // SANA_TEST_HOST_TIMELINE: a CPU run keeps the device timeline of a CUDA run
  // (step/device_timeline.h) on the host's clock, so its metrics.jsonl "device_time" and the
  // log's device phases are tested without a GPU.
  bool host_timeline = false;
  // SANA_TEST_CUDA_DEVICES="GPU-a,GPU-b": these stand in for the visible CUDA devices
  // (the device checks without a GPU); `inject_cuda_devices` when it is set.
  bool inject_cuda_devices = false;
  std::vector<std::string> cuda_devices;
  // What the checkpoint writers call before each stage (ckpt::StageHook): a sleep of
  // ckpt_stage_delay_ms, or nothing (empty) when it is 0.
  std::function<void(const char* stage)> checkpoint_stage_delay() const;
  // The error a rank throws at the step SANA_TEST_FAIL_AT names (its text names the variable).
  static std::string injected_failure(int64_t global_step);

  // The SANA_TEST_* variables of this process's environment (main() reads them once).
  static TestHooks from_environment();
  // Whether "rank:count" names this rank and count.
  static bool matches(const std::string& spec, int rank, int64_t count);
};

}  // namespace sana::train
