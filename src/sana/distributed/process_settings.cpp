#include "sana/distributed/process_settings.h"

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <torch/torch.h>

#include <cstdlib>

#include "sana/util/log.h"

namespace sana::dist {

void set_compute_threads(int threads) {
  torch::set_num_threads(threads);
  // OpenBLAS keeps a pool of its own (as many threads as cores, unless OPENBLAS_NUM_THREADS
  // was set before it loaded) whose threads spin after every product, taking the cores
  // from ATen's pool: with several processes per host it oversubscribes them, and even in
  // one process with 2 threads every elementwise operator after a product runs slower.
  // So OpenBLAS runs on the calling thread only, and the model's big products use ATen's
  // pool through oneDNN (model/layers.cpp, token_product). SanaMS_tiny_P2_D4, batch 8 of
  // 64x64, one process on 2 threads: 0.75 -> 0.46 s a step (apps/bench_ddp).
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(1);
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
