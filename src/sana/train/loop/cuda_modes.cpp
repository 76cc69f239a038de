#include "sana/train/loop/cuda_modes.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Backtrace.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "sana/util/log.h"

namespace sana::train {

namespace {

c10::cuda::SyncDebugMode sync_mode(const std::string& name) {
  if (name == "off") return c10::cuda::SyncDebugMode::L_DISABLED;
  if (name == "warn") return c10::cuda::SyncDebugMode::L_WARN;
  if (name == "error") return c10::cuda::SyncDebugMode::L_ERROR;
  throw std::invalid_argument("train.cuda_sync_debug: '" + name + "' is none of off, warn, error");
}

// c10's sync-debug warning names only itself: this handler logs each with the stack that
// reached it (frames as "<unknown function> + 0xOFFSET (... in sana-train)" for the
// binary's own functions: `addr2line -f -C -e sana-train OFFSET` names them), and hands
// every other warning to the handler before it.
class SyncWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    if (w.msg().find("synchronizing CUDA operation") == std::string::npos) {
      if (previous_ != nullptr) previous_->process(w);
      return;
    }
    const auto n = ++count_;
    log::warn("train.cuda_sync_debug: the host waited for the GPU ({} so far), called from:\n{}", n,
              c10::get_backtrace(/*frames_to_skip=*/4, /*maximum_number_of_frames=*/16));
  }
  void install() {
    if (installed_) return;
    previous_ = c10::WarningUtils::get_warning_handler();
    c10::WarningUtils::set_warning_handler(this);
    installed_ = true;
  }

 private:
  c10::WarningHandler* previous_ = nullptr;
  std::atomic<int64_t> count_{0};
  bool installed_ = false;
};

SyncWarnings& sync_warnings() {
  static SyncWarnings handler;  // for the process's life: c10 keeps the pointer
  return handler;
}

}  // namespace

void apply_cuda_modes(const CudaModes& modes) {
  at::globalContext().setBenchmarkCuDNN(modes.cudnn_benchmark);
  if (modes.sync_debug == "warn") sync_warnings().install();
  c10::cuda::warning_state().set_sync_debug_mode(sync_mode(modes.sync_debug));
  if (!modes.cudnn_benchmark) log::info("train.cudnn_benchmark false: cuDNN picks its convolution algorithms by heuristics");
  if (modes.sync_debug != "off") {
    log::info("train.cuda_sync_debug {}: every operation that waits for the GPU {}", modes.sync_debug,
              modes.sync_debug == "warn" ? "is logged with the stack that called it" : "throws");
  }
}

CudaModes current_cuda_modes() {
  CudaModes m;
  m.cudnn_benchmark = at::globalContext().benchmarkCuDNN();
  switch (c10::cuda::warning_state().get_sync_debug_mode()) {
    case c10::cuda::SyncDebugMode::L_DISABLED: m.sync_debug = "off"; break;
    case c10::cuda::SyncDebugMode::L_WARN: m.sync_debug = "warn"; break;
    case c10::cuda::SyncDebugMode::L_ERROR: m.sync_debug = "error"; break;
  }
  return m;
}

}  // namespace sana::train
