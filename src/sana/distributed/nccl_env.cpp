#include "sana/distributed/nccl_env.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace sana::dist {

namespace {

const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace

NcclEnvironment apply_nccl_defaults(bool torch_aborts_by_default) {
  NcclEnvironment env;
  // 2.x reads the TORCH_ name first and falls back to the old one; 1.13 knows only the old.
  const char* handling = value_of("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  if (handling == nullptr) handling = value_of("NCCL_ASYNC_ERROR_HANDLING");
  if (handling == nullptr && !torch_aborts_by_default) {
    setenv("NCCL_ASYNC_ERROR_HANDLING", "1", 1);
    env.set_by_us.push_back("NCCL_ASYNC_ERROR_HANDLING=1");
  } else if (handling != nullptr && std::strcmp(handling, "0") == 0 &&
             value_of("TORCH_NCCL_BLOCKING_WAIT") == nullptr && value_of("NCCL_BLOCKING_WAIT") == nullptr) {
    env.warning =
        "NCCL async error handling is off (0) and blocking wait is not on: a collective stuck past "
        "dist.timeout_s will hang this job instead of ending it; unset TORCH_NCCL_ASYNC_ERROR_HANDLING "
        "or set it to 1";
  }
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("NCCL_", 0) == 0 || kv.rfind("TORCH_NCCL_", 0) == 0) env.variables.push_back(kv);
  }
  std::sort(env.variables.begin(), env.variables.end());
  return env;
}

}  // namespace sana::dist
