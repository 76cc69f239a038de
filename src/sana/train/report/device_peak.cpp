#include "sana/train/report/device_peak.h"

#include <array>

namespace sana::train {

double peak_tflops_for(const std::string& name, bool half) {
  struct Part {
    const char* match;  // a part of the device name; the first match wins
    double half_tflops;
  };
  // NVIDIA's data sheets, dense bf16/fp16 tensor-core peak; TF32 is half of it on these.
  static constexpr std::array<Part, 12> parts{{{"H200", 989.4},
                                               {"GH200", 989.4},
                                               {"H100 PCIe", 756.0},
                                               {"H100 NVL", 835.0},
                                               {"H100", 989.4},
                                               {"H800", 989.4},
                                               {"A100", 312.0},
                                               {"A800", 312.0},
                                               {"L40S", 362.0},
                                               {"L40", 181.0},
                                               {"A10", 125.0},
                                               {"L4", 121.0}}};
  for (const auto& p : parts) {
    if (name.find(p.match) != std::string::npos) return half ? p.half_tflops : p.half_tflops / 2;
  }
  return 0;
}

}  // namespace sana::train
