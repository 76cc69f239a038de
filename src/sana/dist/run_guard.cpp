#include "sana/dist/run_guard.h"

#include "sana/dist/runtime.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace sana::dist {

int run_guarded(const LaunchEnv& env, const std::function<int()>& body) {
  (void)env;
  try {
    return body();
  } catch (const LaunchEnvError& e) {
    log::error("launch error: {}", e.what());
    return kExitUsage;
  } catch (const DeviceError& e) {
    log::error("device error: {}", e.what());
    return kExitUsage;
  } catch (const Disagreement& e) {
    log::error("start-up check failed: {}", e.what());
    return kExitUsage;
  } catch (const PeerFailure& e) {
    log::error("stopping because another rank failed: {}", e.what());
    return kExitPeerFailed;
  } catch (const DistTimeout& e) {
    log::error("{}", e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    log::error("failed: {}", e.what());
    return kExitFailure;
  }
}

}  // namespace sana::dist
