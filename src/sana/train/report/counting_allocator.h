// The CPU allocator, counting what it holds while a CountingScope lives: the bytes of every
// tensor (and raw block) allocated since the scope began and not yet freed, and the peak of
// that. The memory estimate measures a model's forward and backward with it, and a CPU run
// its first step's (memory_use.h's PeakProbe), so both count the same thing: tensors, not the
// process's pages (glibc keeps freed pages; VmHWM saw 1.4x what the tensors needed).
#pragma once

#include <cstdint>
#include <memory>

namespace sana::train {

class CountingScope {
 public:
  CountingScope();
  ~CountingScope();
  CountingScope(const CountingScope&) = delete;
  CountingScope& operator=(const CountingScope&) = delete;
  int64_t held() const;   // bytes allocated in this scope and still held
  int64_t peak() const;   // the most held at once since the scope began (or reset_peak())
  void reset_peak();      // the peak is now what is held

 private:
  class Counter;
  std::unique_ptr<Counter> counter_;
};

}  // namespace sana::train
