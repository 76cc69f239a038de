// Shared by the libFuzzer targets: the input as a file (the readers under test take
// paths), unique per process so parallel fuzzers never share one. The contract every
// target checks: a reader either succeeds or throws sana::Error (a message for the user);
// anything else escaping it, a crash, or a sanitizer report is a bug.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace sana::fuzz {

// Writes `size` bytes to a per-process file ending in `suffix`; returns its path.
inline std::string as_file(const uint8_t* data, size_t size, const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path =
      std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/sana-fuzz-" + std::to_string(getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace sana::fuzz
