#include "sana/distributed/process_settings.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <torch/torch.h>

#include <cstdlib>

#include "sana/util/log.h"

namespace sana::dist {

void set_compute_threads(int threads) {
  torch::set_num_threads(threads);
  // pip's LibTorch runs its products in MKL on the same OpenMP pool, so this one setting
  // bounds every thread the process computes on.
}

void keep_freed_memory() {
#if defined(__GLIBC__)
  // Whoever set glibc's own variables chose for themselves.
  for (const char* name : {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (std::getenv(name) != nullptr) return;
  }
  // 32 MiB is the largest threshold glibc takes (half its 64 MiB arena heaps); setting it
  // also stops glibc adjusting it, which is why the trim threshold must be set too.
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 1 << 30) != 1) {
    log::warn("glibc refused the allocator settings (mallopt): large tensors are mapped afresh every step");
  }
#endif
}

}  // namespace sana::dist
