#include "sana/train/report/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "sana/torch_compat.h"

namespace sana::train {

namespace counting {  // named: CountingScope::Counter holds one (an anonymous type there warns)

// The CPU allocator, counting the bytes it holds (installed for one measurement). Some
// kernels take raw memory from it (raw_allocate: the context must be the data pointer and
// the deleter a plain function), so what each block holds is found by its address.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  int64_t peak() const { return peak_->load(); }
  void reset_peak() { peak_->store(held_->load()); }
  c10::DataPtr allocate(size_t n) override { return counted(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  int64_t held() const { return held_->load(); }

 private:
  // A tensor may outlive the allocator (a cache somewhere): the count it returns to does not.
  using Count = std::shared_ptr<std::atomic<int64_t>>;
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    Count count;
  };
  struct Live {
    std::mutex mutex;
    std::unordered_map<void*, Held> blocks;
  };
  static Live& live() {
    static Live l;
    return l;
  }
  c10::DataPtr counted(size_t n) const {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    if (data != nullptr) {
      const int64_t now = *held_ += static_cast<int64_t>(n);
      int64_t seen = peak_->load();
      while (now > seen && !peak_->compare_exchange_weak(seen, now)) {
      }
      std::lock_guard<std::mutex> lock(live().mutex);
      live().blocks.emplace(data, Held{std::move(inner), n, held_});
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  static void release(void* data) {
    if (data == nullptr) return;
    Held gone;
    {
      std::lock_guard<std::mutex> lock(live().mutex);
      auto it = live().blocks.find(data);
      if (it == live().blocks.end()) return;
      gone = std::move(it->second);
      live().blocks.erase(it);
    }
    *gone.count -= static_cast<int64_t>(gone.bytes);
  }  // `gone.inner` frees the block here, outside the lock
  c10::Allocator* inner_;
  Count held_ = std::make_shared<std::atomic<int64_t>>(0);
  Count peak_ = std::make_shared<std::atomic<int64_t>>(0);
};

uint8_t g_priority = 10;  // c10 only replaces an allocator with one of the same or higher priority

}  // namespace counting

// Installs a counting allocator for its lifetime; the default one comes back after, at a
// higher priority.
class CountingScope::Counter {
 public:
  Counter() : allocator(c10::GetDefaultCPUAllocator()) { c10::SetCPUAllocator(&allocator, ++counting::g_priority); }
  ~Counter() { c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), ++counting::g_priority); }
  counting::CountingAllocator allocator;
};

CountingScope::CountingScope() : counter_(std::make_unique<Counter>()) {}
CountingScope::~CountingScope() = default;
int64_t CountingScope::held() const { return counter_->allocator.held(); }
int64_t CountingScope::peak() const { return counter_->allocator.peak(); }
void CountingScope::reset_peak() { counter_->allocator.reset_peak(); }

}  // namespace sana::train
