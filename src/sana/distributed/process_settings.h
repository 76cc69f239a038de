// The process's own compute settings, made once at start (Runtime::start): threads, and how
// the host allocator treats what a step frees.
#pragma once

namespace sana::dist {

// LibTorch's intra-op threads (its products' too: MKL on the same pool) set to `threads`.
void set_compute_threads(int threads);

// The host allocator keeps what a step frees for the next step: a step allocates and frees
// the same large tensors every time, and glibc's defaults map each one above 128 KiB (its
// threshold adapts only partly) afresh, so every page of it faults in zeroed on first touch
// and goes back to the kernel when freed. Allocations up to 32 MiB come from the heap, and
// free memory at its top is returned only above 1 GiB. SanaMS_tiny_P2_D4, batch 8 of 64x64,
// one thread: 0.716 -> 0.668 s a step (apps/bench_ddp). Not where GLIBC_TUNABLES or
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ are set. Runtime::start calls it.
void keep_freed_memory();

}  // namespace sana::dist
