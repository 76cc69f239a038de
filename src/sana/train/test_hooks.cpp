#include "sana/train/test_hooks.h"

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace sana::train {

std::function<void(const char*)> TestHooks::checkpoint_stage_delay() const {
  if (ckpt_stage_delay_ms <= 0) return {};
  const auto delay = std::chrono::milliseconds(ckpt_stage_delay_ms);
  return [delay](const char*) { std::this_thread::sleep_for(delay); };
}

namespace {

std::string text_of(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

int64_t number_of(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? 0 : std::atoll(v);
}

}  // namespace

TestHooks TestHooks::from_environment() {
  TestHooks h;
  h.fail_at = text_of("SANA_TEST_FAIL_AT");
  h.log_ids = std::getenv("SANA_TEST_LOG_IDS") != nullptr;
  h.dump_batches = std::getenv("SANA_TEST_DUMP_BATCHES") != nullptr;
  h.host_timeline = std::getenv("SANA_TEST_HOST_TIMELINE") != nullptr;
  h.ckpt_stage_delay_ms = number_of("SANA_TEST_CKPT_STAGE_DELAY_MS");
  h.index_delay_ms = number_of("SANA_TEST_INDEX_DELAY_MS");
  h.kill_after_features = text_of("SANA_TEST_KILL_AFTER_FEATURES");
  h.spawn_pause = text_of("SANA_TEST_SPAWN_PAUSE_MS");
  if (const char* list = std::getenv("SANA_TEST_CUDA_DEVICES")) {
    h.inject_cuda_devices = true;
    std::stringstream in(list);
    std::string id;
    while (std::getline(in, id, ',')) {
      if (!id.empty()) h.cuda_devices.push_back(id);
    }
  }
  return h;
}

std::string TestHooks::injected_failure(int64_t global_step) {
  return "injected data error at step " + std::to_string(global_step) + " (SANA_TEST_FAIL_AT)";
}

bool TestHooks::matches(const std::string& spec, int rank, int64_t count) {
  return !spec.empty() && spec == std::to_string(rank) + ":" + std::to_string(count);
}

}  // namespace sana::train
