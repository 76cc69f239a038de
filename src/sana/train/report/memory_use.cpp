#include "sana/train/report/memory_use.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "sana/util/error.h"

namespace sana::train {

namespace {

// A field of /proc/self/status in bytes ("VmRSS:    1234 kB"); -1 when missing.
int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::istringstream rest(line.substr(prefix.size()));
    int64_t kb = -1;
    rest >> kb;
    return kb < 0 ? -1 : kb * 1024;
  }
  return -1;
}

// Resets VmHWM to the current resident size (Linux 4.0+); false where not allowed.
bool reset_peak_resident() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

std::string gib(int64_t bytes) { return fmt::format("{:.3f} GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

std::string MemoryUse::json() const {
  return nlohmann::json{{"rank", rank},
                        {"parameters", parameters},
                        {"gradients", gradients},
                        {"optimizer", optimizer},
                        {"ema", ema},
                        {"gathered", gathered},
                        {"activations_peak", activations_peak},
                        {"activations_source", activations_source}}
      .dump();
}

MemoryUse MemoryUse::from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  MemoryUse m;
  m.rank = j.at("rank").get<int>();
  m.parameters = j.at("parameters").get<int64_t>();
  m.gradients = j.at("gradients").get<int64_t>();
  m.optimizer = j.at("optimizer").get<int64_t>();
  m.ema = j.at("ema").get<int64_t>();
  m.gathered = j.at("gathered").get<int64_t>();
  m.activations_peak = j.at("activations_peak").get<int64_t>();
  m.activations_source = j.at("activations_source").get<std::string>();
  return m;
}

std::string MemoryUse::line() const {
  return fmt::format("memory on rank {} after its first step: parameters {}, gradients {}, optimizer state {}, EMA {}, "
                     "gathered parameters {}, activations {} ({})",
                     rank, gib(parameters), gib(gradients), gib(optimizer), gib(ema), gib(gathered),
                     activations_peak < 0 ? std::string("not measured") : gib(activations_peak), activations_source);
}

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto& storage = t.storage();
    if (seen.insert(storage.data()).second) n += static_cast<int64_t>(storage.nbytes());
  }
  return n;
}

void PeakProbe::begin() {
  if (device_.is_cuda()) {
    reset_cuda_peak(device_.index());
    at_begin_ = cuda_allocated_bytes(device_.index());
    reset_ = at_begin_ >= 0;
    return;
  }
  reset_ = reset_peak_resident();
  at_begin_ = proc_status_bytes("VmRSS");
}

int64_t PeakProbe::growth() const {
  if (!reset_ || at_begin_ < 0) return -1;
  const int64_t peak = device_.is_cuda() ? cuda_peak_bytes(device_.index()) : proc_status_bytes("VmHWM");
  return peak < 0 ? -1 : std::max<int64_t>(0, peak - at_begin_);
}

const char* PeakProbe::source() const {
  return device_.is_cuda() ? "cuda allocator peak" : "peak resident size (VmHWM)";
}

void write_memory_json(const std::string& path, const std::vector<MemoryUse>& ranks) {
  nlohmann::json j;
  j["ranks"] = nlohmann::json::array();
  for (const auto& m : ranks) j["ranks"].push_back(nlohmann::json::parse(m.json()));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) throw RunError(fmt::format("cannot write {}", tmp), "memory report");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace sana::train
