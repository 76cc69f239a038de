// train.profile_steps' per-op table: its attribution rules on made-up events (own host
// time, a kernel counting for the op around the runtime call that launched it), and a real
// recording through LibTorch's profiler whose table counts the same calls as the trace
// Kineto wrote beside it.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "sana/train/report/step_profile.h"
#include "test_support.h"

using namespace sana::train;
namespace fs = std::filesystem;

namespace {

ProfiledEvent host(std::string name, uint64_t start, uint64_t end, uint64_t correlation = 0, bool runtime = false) {
  ProfiledEvent e;
  e.name = std::move(name);
  e.thread = 1;
  e.start_ns = start;
  e.end_ns = end;
  e.correlation = correlation;
  e.runtime = runtime;
  return e;
}

ProfiledEvent kernel(std::string name, uint64_t start, uint64_t end, uint64_t launched_by) {
  ProfiledEvent e;
  e.name = std::move(name);
  e.start_ns = start;
  e.end_ns = end;
  e.on_device = true;
  e.launched_by = launched_by;
  return e;
}

const OpRow& row(const std::vector<OpRow>& rows, const std::string& op) {
  for (const auto& r : rows) {
    if (r.op == op) return r;
  }
  FAIL("no row " << op);
  return rows.front();
}

}  // namespace

TEST_CASE("the op table counts each op's own host time and the kernels it launched", "[train][profile]") {
  // aten::linear (0-10 ms) holds aten::addmm (2-8 ms), which calls cudaLaunchKernel (3-4 ms);
  // the GEMM kernel (20-26 ms) links to the launch; a copy links to nothing recorded.
  const uint64_t ms = 1000000;
  std::vector<ProfiledEvent> events{
      host("aten::linear", 0, 10 * ms, 1),
      host("aten::addmm", 2 * ms, 8 * ms, 2),
      host("cudaLaunchKernel", 3 * ms, 4 * ms, 77, true),
      kernel("sm90_gemm", 20 * ms, 26 * ms, 77),
      kernel("Memcpy HtoD", 30 * ms, 32 * ms, 0),
      host("aten::linear", 40 * ms, 41 * ms, 3),
  };
  const auto rows = op_table(events);
  CHECK(row(rows, "aten::linear").calls == 2);
  CHECK(row(rows, "aten::linear").cpu_ms == Approx(10 - 6 + 1));
  CHECK(row(rows, "aten::addmm").cpu_ms == Approx(5));
  CHECK(row(rows, "aten::addmm").device_ms == Approx(6));
  CHECK(row(rows, "cudaLaunchKernel").device_ms == 0);
  CHECK(row(rows, "(device) Memcpy HtoD").device_ms == Approx(2));
  // Shares are of the device's time, largest first.
  CHECK(rows.front().op == "aten::addmm");
  CHECK(rows.front().share == Approx(0.75));
  double total = 0;
  for (const auto& r : rows) total += r.share;
  CHECK(total == Approx(1.0));
  const auto tsv = op_table_tsv(rows);
  CHECK(tsv.rfind("op\tcalls\tcpu_ms\tdevice_ms\tshare\naten::addmm\t1\t5.000\t6.000\t0.7500\n", 0) == 0);
}

TEST_CASE("without device events the shares are of the host time", "[train][profile]") {
  const uint64_t ms = 1000000;
  const auto rows = op_table({host("aten::mm", 0, 3 * ms, 1), host("aten::add", 3 * ms, 4 * ms, 2)});
  CHECK(rows.front().op == "aten::mm");
  CHECK(rows.front().share == Approx(0.75));
  CHECK(rows.back().share == Approx(0.25));
}

TEST_CASE("StepProfiler records only the steps asked for, its table agreeing with Kineto's trace", "[train][profile]") {
  sana::test::TempDir dir;
  StepProfiler profiler({2}, dir.path(), /*on=*/true, /*cuda=*/false);
  const auto a = torch::randn({64, 64});
  for (int64_t step = 1; step <= 3; ++step) {
    profiler.begin(step);
    auto x = a;
    for (int i = 0; i < 7; ++i) x = torch::mm(x, a).tanh();
    profiler.end();
  }
  CHECK_FALSE(fs::exists(fs::path(dir.path("profile")) / "step_1.ops.tsv"));
  CHECK_FALSE(fs::exists(fs::path(dir.path("profile")) / "step_3.ops.tsv"));
  std::ifstream tsv(fs::path(dir.path("profile")) / "step_2.ops.tsv");
  REQUIRE(tsv);
  std::string line;
  std::getline(tsv, line);
  CHECK(line == "op\tcalls\tcpu_ms\tdevice_ms\tshare");
  std::map<std::string, int64_t> calls;
  double share = 0;
  while (std::getline(tsv, line)) {
    std::istringstream in(line);
    std::string op, n, cpu, device, s;
    std::getline(in, op, '\t');
    std::getline(in, n, '\t');
    std::getline(in, cpu, '\t');
    std::getline(in, device, '\t');
    std::getline(in, s, '\t');
    calls[op] = std::stoll(n);
    share += std::stod(s);
  }
  CHECK(calls["aten::mm"] == 7);
  CHECK(calls["aten::tanh"] == 7);
  CHECK(share == Approx(1.0).margin(1e-3));
  // Kineto's own file: the same ops, as many times.
  std::ifstream trace(fs::path(dir.path("profile")) / "step_2.trace.json");
  REQUIRE(trace);
  const auto j = nlohmann::json::parse(trace);
  std::map<std::string, int64_t> traced;
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("cat", "") == "cpu_op") ++traced[e.value("name", "")];
  }
  CHECK(traced["aten::mm"] == calls["aten::mm"]);
  CHECK(traced["aten::tanh"] == calls["aten::tanh"]);
}
