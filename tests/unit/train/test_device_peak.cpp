// MFU's denominator: the dense peak of a GPU by the name CUDA reports, the most specific
// entry first (an H100 PCIe is not an SXM H100, an A100 is not an A10), TF32 half of it.
#include "catch.h"

#include "sana/train/report/device_peak.h"

using sana::train::peak_tflops_for;

TEST_CASE("GPU peaks by device name", "[train][mfu]") {
  CHECK(peak_tflops_for("NVIDIA H100 80GB HBM3", true) == Approx(989.4));
  CHECK(peak_tflops_for("NVIDIA H100 PCIe", true) == Approx(756.0));
  CHECK(peak_tflops_for("NVIDIA H200", true) == Approx(989.4));
  CHECK(peak_tflops_for("NVIDIA A100-SXM4-80GB", true) == Approx(312.0));
  CHECK(peak_tflops_for("NVIDIA A100-SXM4-80GB", false) == Approx(156.0));
  CHECK(peak_tflops_for("NVIDIA A10", true) == Approx(125.0));
  CHECK(peak_tflops_for("NVIDIA L40S", true) == Approx(362.0));
  CHECK(peak_tflops_for("NVIDIA L4", true) == Approx(121.0));
  CHECK(peak_tflops_for("Tesla T4", true) == 0);  // unknown: no MFU, the log says how to set it
  CHECK(peak_tflops_for("", true) == 0);
}
