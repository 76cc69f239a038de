#include "sana/train/loop/stop_requests.h"

#include <atomic>
#include <csignal>

namespace sana::train {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

void StopRequests::watch_signals() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

bool StopRequests::signalled() const { return g_stop_signal.load() != 0; }

bool StopRequests::out_of_time() const {
  if (hours_ <= 0) return false;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 3600.0 > hours_;
}

}  // namespace sana::train
