#include "sana/train/report/memory_use.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "sana/util/error.h"

namespace sana::train {

namespace {

std::string gib(int64_t bytes) { return fmt::format("{:.3f} GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

std::string MemoryUse::json() const {
  return nlohmann::json{{"rank", rank},
                        {"parameters", parameters},
                        {"gradients", gradients},
                        {"optimizer", optimizer},
                        {"ema", ema},
                        {"gathered", gathered},
                        {"working", working},
                        {"encoders", encoders},
                        {"host_weights", host_weights},
                        {"host_gradients", host_gradients},
                        {"host_optimizer", host_optimizer},
                        {"host_ema", host_ema},
                        {"host_blocks", host_blocks},
                        {"activations_peak", activations_peak},
                        {"activations_source", activations_source},
                        {"micro_batch", micro_batch},
                        {"h_tokens", h_tokens},
                        {"w_tokens", w_tokens}}
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
  m.working = j.value("working", int64_t{0});
  m.encoders = j.value("encoders", int64_t{0});
  m.host_weights = j.value("host_weights", int64_t{0});
  m.host_gradients = j.value("host_gradients", int64_t{0});
  m.host_optimizer = j.value("host_optimizer", int64_t{0});
  m.host_ema = j.value("host_ema", int64_t{0});
  m.host_blocks = j.value("host_blocks", int64_t{0});
  m.activations_peak = j.at("activations_peak").get<int64_t>();
  m.activations_source = j.at("activations_source").get<std::string>();
  m.micro_batch = j.value("micro_batch", int64_t{0});
  m.h_tokens = j.value("h_tokens", int64_t{0});
  m.w_tokens = j.value("w_tokens", int64_t{0});
  return m;
}

std::string MemoryUse::line() const {
  return fmt::format("memory on rank {} after its first step: parameters {}, gradients {}, optimizer state {}, EMA {}, "
                     "gathered parameters {}, half working weights {}, frozen encoders {}, activations {} ({}){}",
                     rank, gib(parameters), gib(gradients), gib(optimizer), gib(ema), gib(gathered), gib(working),
                     gib(encoders),
                     activations_peak < 0 ? std::string("not measured") : gib(activations_peak), activations_source,
                     host_weights + host_gradients + host_optimizer + host_ema + host_blocks == 0
                         ? std::string()
                         : fmt::format("; in host memory: master weights {}, their gradients {}, optimizer state {}, "
                                       "EMA {}, swapped blocks {}",
                                       gib(host_weights), gib(host_gradients), gib(host_optimizer), gib(host_ema),
                                       gib(host_blocks)));
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

PeakProbe::PeakProbe(torch::Device device) : device_(device) {}
PeakProbe::~PeakProbe() = default;

void PeakProbe::begin() {
  growth_ = -1;
  if (device_.is_cuda()) {
    reset_cuda_peak(device_.index());
    at_begin_ = cuda_allocated_bytes(device_.index());
    return;
  }
  counting_ = std::make_unique<CountingScope>();  // counts what is allocated from now on
  at_begin_ = 0;
}

void PeakProbe::end() {
  if (device_.is_cuda()) {
    const int64_t peak = cuda_peak_bytes(device_.index());
    growth_ = peak < 0 || at_begin_ < 0 ? -1 : std::max<int64_t>(0, peak - at_begin_);
    return;
  }
  if (!counting_) return;
  growth_ = counting_->peak();
  counting_.reset();
}

const char* PeakProbe::source() const { return device_.is_cuda() ? "cuda allocator peak" : "cpu allocator peak"; }

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
