// The NCCL environment of a run. LibTorch's ProcessGroupNCCL reads it when the group is
// made; torch-free so it is tested without CUDA.
#pragma once

#include <string>
#include <vector>

namespace sana::dist {

struct NcclEnvironment {
  std::vector<std::string> variables;  // every NCCL_* and TORCH_NCCL_* as NAME=VALUE, sorted
  std::vector<std::string> set_by_us;  // the defaults this call set (NAME=VALUE)
  std::string warning;                 // a setting that lets a stuck collective hang; "" when none
};

// A collective stuck past dist.timeout_s must end the job, not hang it. LibTorch 2.2+ aborts
// by default (TORCH_NCCL_ASYNC_ERROR_HANDLING, default 3). 1.13 does not (its
// NCCL_ASYNC_ERROR_HANDLING defaults to 0): there, when neither name is set, this sets
// NCCL_ASYNC_ERROR_HANDLING=1. A user's explicit 0 is kept, and reported as a warning.
NcclEnvironment apply_nccl_defaults(bool torch_aborts_by_default);

}  // namespace sana::dist
