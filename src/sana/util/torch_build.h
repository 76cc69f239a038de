// What this binary was built with and what this process can use: LibTorch's version, the
// CUDA it was compiled with, and the CUDA devices visible here. Every run's start line says it,
// so a log tells which binary ran and whether it saw a GPU.
#pragma once

#include <string>

namespace sana::util {

// E.g. "LibTorch 2.11.0, CUDA 13.0 compiled in, 1 CUDA device" or
// "LibTorch 2.11.0, CUDA 13.0 compiled in, no device".
std::string torch_build_summary();

}  // namespace sana::util
